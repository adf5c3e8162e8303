"""One command for a machine with a CUDA GPU: our modules on the GPU, checked and timed, as ONE markdown table.

    python benchmarks/gpu_check.py                      # on a CUDA machine: the full check, under 10 minutes
    python benchmarks/gpu_check.py --device cpu --quick  # anywhere: small n, 4 tokens (proves the script runs)

Without CUDA and without --device cpu it prints one line saying no GPU was found and exits 2.

Rows (each is caught on its own: a failure prints as that row with its one-line error):

1. parity, one row per family: the tiny seeded random configs the parity tests build (tests/hub/test_parity*.py),
   saved with save_pretrained, loaded with `attn_explorer.load_model(folder, device=...)`, run in float32 on the
   device beside transformers eager on the same device; the value is the max |ours - transformers| over every
   layer's attention map and over the last hidden state (limit 1e-5, the tests' tolerance). Needs pytest
   (the builders are imported from the tests package) and transformers.
2. 16-bit error: `Model.dtype_error(x)` of MiniLM (BERT) and SmolLM2 (Llama) loaded in bfloat16 and float16 on
   the device: max |error| of the maps and of the last hidden state against the checkpoint in float32.
3. chunked attention (core.efficient.chunked, the Cost page's FlashAttention-style variant) at n = 262,144
   (4,096 with --quick): wall time and torch.cuda.max_memory_allocated (reset before the call) against the bytes
   the naive n² maps would need (computed, not allocated) and cost.variants' prediction for chunked; the first
   rows of the output are checked against exact softmax attention.
4. generation speed of the built-ins smollm2-135m and gemma3-270m: tokens per second over 32 greedy tokens
   (4 with --quick) through Model.generate; skipped with the reason when the weights' package is missing.

Columns: what, device, dtype, value, reference/limit, verdict (ok / FAIL / info / skip / error). The table goes to
stdout (after one line naming the device), everything the loaders print goes to stderr; the exit status is 1 when a
row says FAIL or error, else 0. On CUDA, TF32 products are switched off for the whole run (exact float32).
--trace prints each failing row's traceback to stderr.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `tests` and `attn_explorer` import from the source tree
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

TOL = 1e-5
PROMPT = "The animal didn't cross the street because it was too tired. It"
TEXT = "The animal didn't cross the street because it was too tired."
ROWS: list[tuple[str, str, str, str, str, str]] = []


def row(what, device, dtype, value, ref, verdict):
    ROWS.append(tuple(str(c).replace("|", "/").replace("\n", " ") for c in (what, device, dtype, value, ref, verdict)))


def one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return (text[0] if text else type(e).__name__)[:200]


def guarded(what, device, dtype, fn):
    """Run fn(); a failure becomes one row with its one-line error instead of ending the script."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - every failure is one row
        if "--trace" in sys.argv:
            traceback.print_exc()
        row(what, device, dtype, "—", "—", f"error: {one_line(e)}")


@contextlib.contextmanager
def stdout_to_stderr():
    """Send everything written to stdout, by Python or by native code (the tokenizer trainer writes to
    file descriptor 1 itself), to stderr until the block ends: stdout carries the table only."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


# ---- 1. parity with transformers eager ---------------------------------------------------------------------

def _max_diff(ours_att, ref_att, ours_hidden, ref_hidden):
    if ours_att.shape[1] != len(ref_att):
        raise RuntimeError(f"{ours_att.shape[1]} layers of maps against transformers' {len(ref_att)}")
    att = max((ours_att[:, i] - a).abs().max().item() for i, a in enumerate(ref_att))
    return att, (ours_hidden - ref_hidden).abs().max().item()


def parity_cases():
    """name -> fn(folder) -> (hf model saved in folder, fn_ref(hf, device), fn_ours(module, device)).

    Each builder is the parity tests' own (seeded), imported from the tests package."""
    import transformers

    from tests.hub import test_parity as tp
    from tests.hub import test_parity_bart as tb
    from tests.hub import test_parity_clip_siglip as tc
    from tests.hub import test_parity_gemma as tg
    from tests.hub import test_parity_more_families as tm
    from tests.hub import test_parity_rotary_families as tr

    def ids_of(vocab, n=13, lo=3):
        g = torch.Generator().manual_seed(0)
        return torch.randint(lo, vocab, (2, n), generator=g)

    def text(build, vocab, base=lambda hf: hf, lo=3):
        def make(folder):
            hf = build(folder)
            ids = ids_of(vocab, lo=lo)
            return hf, (lambda h, d: base(h)(input_ids=ids.to(d), output_attentions=True)), \
                (lambda m, d: m(input_ids=ids.to(d), output_attentions=True))
        return make

    def saved(hf, folder):
        hf.save_pretrained(folder, safe_serialization=True)
        return hf

    def encoder(family):
        def build(folder):
            torch.manual_seed(0)
            common = dict(vocab_size=99, hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                          intermediate_size=37, max_position_embeddings=64, attn_implementation="eager",
                          hidden_act="gelu", initializer_range=0.3)
            if family == "bert":
                return saved(transformers.BertModel(transformers.BertConfig(**common)).eval(), folder)
            cfg = transformers.RobertaConfig(pad_token_id=1, type_vocab_size=1, **common)
            return saved(transformers.RobertaModel(cfg).eval(), folder)
        return build

    def gpt2(folder):
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(vocab_size=80, n_embd=48, n_layer=2, n_head=3, n_positions=40,
                                      attn_implementation="eager", initializer_range=0.3)
        return saved(transformers.GPT2Model(cfg).eval(), folder)

    def vision(family, patch, size, heads, hw):
        def make(folder):
            torch.manual_seed(0)
            hf = tp._vision_model(family, patch, size, heads).eval()
            with torch.no_grad():
                for name, p in hf.named_parameters():
                    if "token" in name or "position_embeddings" in name or "lambda1" in name:
                        p.normal_(std=0.5)
            saved(hf, folder)
            pixels = torch.randn(1, 3, *hw, generator=torch.Generator().manual_seed(0))
            kw = {} if family == "dinov2" else {"interpolate_pos_encoding": True}
            return hf, (lambda h, d: h(pixel_values=pixels.to(d), output_attentions=True, **kw)), \
                (lambda m, d: m(pixels=pixels.to(d), output_attentions=True))
        return make

    def tower(kind):
        def make(folder):
            hf = saved(tc._vision(kind), folder)
            pixels = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(0))
            return hf, (lambda h, d: tc._vision_tower(h)(pixel_values=pixels.to(d), output_attentions=True,
                                                         interpolate_pos_encoding=True)), \
                (lambda m, d: m(pixels=pixels.to(d), output_attentions=True))
        return make

    def rotary(name):
        return text(lambda folder: tr.make_folder(folder, name), tr.VOCAB, tr._base)

    def gemma(build):
        return text(lambda folder: saved(build(), folder), 99, lambda hf: hf.model)

    def opt(folder):
        torch.manual_seed(0)
        vocab = tr.train_tokenizer().get_vocab_size()
        hf = transformers.OPTModel(tm._opt_config(vocab)).eval()
        with torch.no_grad():
            hf.decoder.embed_positions.weight.normal_(std=tm.SPREAD)
        return saved(hf, folder)

    def distilbert(folder):
        torch.manual_seed(0)
        cfg = transformers.DistilBertConfig(vocab_size=tm.VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=40,
                                            max_position_embeddings=64, activation="gelu",
                                            initializer_range=tm.SPREAD, attn_implementation="eager")
        return saved(transformers.DistilBertModel(cfg).eval(), folder)

    def electra(folder):
        torch.manual_seed(0)
        return saved(transformers.ElectraForPreTraining(tm._electra_config(16)).eval(), folder)

    def bart(folder):
        hf, where = tb.make_bart(folder.parent)  # saves into <its argument>/bart (with a tokenizer)
        assert where == folder, where
        src, tgt = ids_of(20, 9, 4), ids_of(20, 6, 4)

        def ref(h, d):
            out = h(input_ids=src.to(d), decoder_input_ids=tgt.to(d), output_attentions=True)
            return out

        def ours(m, d):
            return m(input_ids=src.to(d), decoder_input_ids=tgt.to(d), output_attentions=True)
        return hf, ref, ours

    cases = {
        "bert": text(encoder("bert"), 99), "roberta": text(encoder("roberta"), 99), "gpt2": text(gpt2, 80),
        "vit": vision("vit", 4, 16, 3, (16, 16)), "deit": vision("deit", 4, 16, 3, (16, 16)),
        "dinov2": vision("dinov2", 14, 56, 3, (56, 56)),
        "clip vision": tower("clip_vision_model"), "siglip vision": tower("siglip_vision_model"),
        "opt": text(opt, 300), "distilbert": text(distilbert, tm.VOCAB, lo=5),
        "electra": text(electra, tm.VOCAB, lambda hf: hf.electra, lo=5),
        "gemma2": gemma(tg._gemma2), "gemma3": gemma(tg._gemma3), "bart": bart,
    }
    for name in tr.CASES:
        cases[name] = rotary(name)
    return cases


def parity_row(name, make, device):
    import attn_explorer as ax

    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / name.replace(" ", "_")
        folder.mkdir()
        hf, ref_fn, ours_fn = make(folder)
        hf = hf.to(device)
        m = ax.load_model(str(folder), device=device)
        with torch.no_grad():
            ref = ref_fn(hf, device)
        with torch.inference_mode():
            ours = ours_fn(m.module, device)
    if hasattr(ref, "encoder_attentions"):  # BART: encoder, decoder and cross maps; both hidden states
        parts = [_max_diff(ours.attentions, ref.encoder_attentions, ours.hidden, ref.encoder_last_hidden_state),
                 _max_diff(ours.decoder_attentions, ref.decoder_attentions, ours.decoder_hidden,
                           ref.last_hidden_state),
                 _max_diff(ours.cross_attentions, ref.cross_attentions, ours.decoder_hidden, ref.last_hidden_state)]
        att, hid = max(p[0] for p in parts), max(p[1] for p in parts)
    else:
        att, hid = _max_diff(ours.attentions, ref.attentions, ours.hidden, ref.last_hidden_state)
    ok = att <= TOL and hid <= TOL
    row(f"parity {name}: maps / hidden", device, "float32", f"{att:.1e} / {hid:.1e}",
        f"≤ {TOL:.0e} vs transformers eager", "ok" if ok else "FAIL")


def check_parity(device):
    if str(device).startswith("cuda"):  # exact float32 on both sides: no TF32 products
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    try:
        import transformers  # noqa: F401
        cases = parity_cases()
    except Exception as e:  # noqa: BLE001
        row("parity (every family)", device, "float32", "—", "—", f"skip: {one_line(e)}")
        return
    for name, make in cases.items():
        guarded(f"parity {name}", device, "float32", lambda: parity_row(name, make, device))


# ---- 2. bf16 / fp16 error against float32 ------------------------------------------------------------------

LIMITS_16 = {"bfloat16": 5e-2, "float16": 1e-2}  # max |map error|; the hidden state is read against its scale


def dtype_row(builtin, dtype, device):
    import attn_explorer as ax
    from attn_explorer.errors import UserError

    try:
        m = ax.load_model(builtin, device=device, dtype=dtype)
    except UserError as e:
        row(f"{builtin} {dtype} error", device, dtype, "—", "—", f"skip: {one_line(e)}")
        return
    e = m.dtype_error(TEXT)
    limit = LIMITS_16[dtype]
    rel = e["max_abs_hidden"] / max(e["hidden_scale"], 1e-12)
    ok = e["max_abs_attention"] <= limit and rel <= 2 * limit
    row(f"{builtin} {dtype} error: maps / hidden ({e['tokens']} tokens)", device, dtype,
        f"{e['max_abs_attention']:.1e} / {e['max_abs_hidden']:.1e} (scale {e['hidden_scale']:.1f})",
        f"maps ≤ {limit:.0e}, hidden ≤ {2 * limit:.0e}·scale, vs {e['reference']}", "ok" if ok else "FAIL")


def check_dtypes(device):
    for builtin in ("minilm", "smollm2-135m"):
        for dtype in ("bfloat16", "float16"):
            guarded(f"{builtin} {dtype} error", device, dtype, lambda: dtype_row(builtin, dtype, device))


# ---- 3. chunked attention at large n ----------------------------------------------------------------------

def chunked_row(device, n):
    from attn_explorer.core import efficient
    from attn_explorer.cost import variants
    from attn_explorer.cost.config import SweepConfig

    heads, d_k = 4, 64
    cfg = SweepConfig(ns=[n], heads=heads, d_k=d_k, device=str(device), dtype="float32")
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, d_k, device=device, generator=g) for _ in range(3))
    cuda = str(device).startswith("cuda")
    if cuda:
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    t0 = time.perf_counter()
    out = efficient.chunked(q, k, v)
    sync(device)
    seconds = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated(device) - before) if cuda else None
    rows = 8  # exact softmax attention for the first rows: (H, 8, n) scores only
    s = (q[0, :, :rows] @ k[0].transpose(-1, -2)) / d_k ** 0.5
    exact = torch.softmax(s, dim=-1) @ v[0]
    err = (out[0, :, :rows] - exact).abs().max().item()
    naive = variants.get("naive").call_bytes(n, cfg)
    predicted = variants.get("chunked").call_bytes(n, cfg)
    mem = f"peak {peak / 2**20:,.0f} MiB above q, k, v" if peak is not None else "peak: CUDA only"
    ok = err <= 1e-4 and (peak is None or peak <= 2 * predicted)
    row(f"chunked attention n = {n:,} (B 1, H {heads}, d_k {d_k}): time, memory; first rows' error", device,
        "float32", f"{seconds:.2f} s; {mem}; err {err:.1e}",
        f"naive n² maps would need {naive / 2**30:,.1f} GiB; predicted chunked {predicted / 2**20:,.0f} MiB; "
        "err ≤ 1e-4", "ok" if ok else "FAIL")


# ---- 4. generation speed ----------------------------------------------------------------------------------

def generation_row(builtin, device, tokens):
    import attn_explorer as ax
    from attn_explorer.errors import UserError

    try:
        m = ax.load_model(builtin, device=device)
    except UserError as e:
        row(f"{builtin} generation", device, "float32", "—", "—", f"skip: {one_line(e)}")
        return
    for _ in m.generate(PROMPT, max_new_tokens=2):  # warm-up: first kernels, caches
        pass
    sync(device)
    t0 = time.perf_counter()
    g = m.generate(PROMPT, max_new_tokens=tokens)
    steps = sum(1 for _ in g)
    sync(device)
    seconds = time.perf_counter() - t0
    row(f"{builtin} greedy generation ({steps} tokens)", device, str(m.dtype).replace("torch.", ""),
        f"{steps / seconds:.1f} tokens/s", f"{tokens} tokens asked; with every step's attention",
        "info" if steps else "FAIL")


# ---- the table --------------------------------------------------------------------------------------------

def table() -> str:
    lines = ["| what | device | dtype | value | reference/limit | verdict |", "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in ROWS]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--quick", action="store_true", help="n = 4,096 for chunked, 4 generated tokens")
    ap.add_argument("--trace", action="store_true", help="print each failing row's traceback to stderr")
    a = ap.parse_args(argv)
    device = a.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("No CUDA GPU found (torch.cuda.is_available() is False); "
              "`--device cpu --quick` runs the reduced check on the CPU.")
        return 2
    t0 = time.perf_counter()
    with stdout_to_stderr():  # loaders' and trainers' chatter: stdout is the table only
        check_parity(device)
        check_dtypes(device)
        n = 4096 if a.quick else 262_144
        guarded(f"chunked attention n = {n:,}", device, "float32", lambda: chunked_row(device, n))
        for builtin in ("smollm2-135m", "gemma3-270m"):
            guarded(f"{builtin} generation", device, "float32",
                    lambda: generation_row(builtin, device, 4 if a.quick else 32))
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else "CPU"
    print(f"gpu_check on {name}, torch {torch.__version__}, {time.perf_counter() - t0:.0f} s"
          f"{' (--quick)' if a.quick else ''}\n")
    print(table())
    return 1 if any(r[-1] == "FAIL" or r[-1].startswith("error") for r in ROWS) else 0


if __name__ == "__main__":
    sys.exit(main())
