"""Loading a sharded checkpoint: ours against transformers' from_pretrained and a raw read of the same files.

A random Qwen2-shaped checkpoint (Llama-shaped where qwen2 is not in hub/families/ yet) of about
1.5 GB in float32 is written as 4 safetensors shards with model.safetensors.index.json in a temporary
folder, which is removed at the end (even on failure or Ctrl-C). Then, each in a fresh process (imports
done before the clock starts), interleaved, --runs times:

- raw: read every shard file end to end in 64 MB chunks (what the disk, or the page cache, gives);
- ours: `attn_explorer.load_model(folder, device="cpu")` (meta build, shard by shard, float32);
- transformers: `AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)`.

Reported: median seconds (min-max), ratios to the raw read, and each process's peak RSS (ru_maxrss) with
the RSS after its imports, so the load's own share shows. The files were just written, so the page cache
is warm for all three alike: the raw read is then a memory-bandwidth read, the hardest bar to meet.

    python benchmarks/bench_sharded_load.py [--runs 3] [--gb 1.5] [--out docs/bench_sharded_load.md]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MARKER = "<!-- results: written by benchmarks/bench_sharded_load.py -->"

CHILD = r"""
import json, resource, sys, time
kind, folder = sys.argv[1], sys.argv[2]
import torch
if kind == "ours":
    from attn_explorer.api.load import load_model
elif kind == "transformers":
    import transformers
    from transformers import AutoModelForCausalLM
    transformers.logging.set_verbosity_error()
from pathlib import Path
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
t0 = time.perf_counter()
if kind == "raw":
    buf = bytearray(64 << 20)
    view = memoryview(buf)
    total = 0
    for f in sorted(Path(folder).glob("*.safetensors")):
        with open(f, "rb", buffering=0) as h:
            while True:
                n = h.readinto(view)
                if not n:
                    break
                total += n
    assert total > 0
    module = None
elif kind == "ours":
    module = load_model(folder, device="cpu", dtype="float32").module
else:
    module = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
t1 = time.perf_counter()
if module is not None:  # safetensors tensors may be memory-mapped: read one value of every 4 kB page
    with torch.no_grad():
        for t in module.state_dict().values():
            float(t.reshape(-1)[:: max(1, 4096 // t.element_size())].sum())
t2 = time.perf_counter()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"call_s": t1 - t0, "s": t2 - t0, "peak_rss": rss, "rss_after_imports": rss0}))
"""

WRITER = r"""
import json, sys
sys.path.insert(0, sys.argv[3])
from pathlib import Path
from benchmarks.bench_sharded_load import config, family, write_checkpoint
fam = family()
cfg = config(fam, float(sys.argv[2]))
total = write_checkpoint(Path(sys.argv[1]), cfg)
print(json.dumps({"family": fam, "cfg": cfg, "total": total}))
"""


def family() -> str:
    from attn_explorer.hub.families import ARCHITECTURES

    return "qwen2" if "qwen2" in ARCHITECTURES else "llama"


def config(fam: str, gb: float) -> dict:
    """A Qwen2-0.5B-like shape scaled (layers) to about gb GB in float32."""
    hidden, inter, vocab, heads, kv = 1024, 3072, 40000, 16, 4
    per_layer = hidden * hidden * 2 + 2 * hidden * (hidden // heads * kv) + 3 * hidden * inter + 2 * hidden
    per_layer += (hidden + 2 * hidden // heads * kv) if fam == "qwen2" else 0  # q/k/v biases
    layers = max(1, round((gb * 1e9 / 4 - 2 * vocab * hidden) / per_layer))
    cfg = dict(hidden_size=hidden, intermediate_size=inter, vocab_size=vocab, num_hidden_layers=layers,
               num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=2048, rms_norm_eps=1e-6,
               rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=False, torch_dtype="float32",
               model_type=fam, architectures=["Qwen2ForCausalLM" if fam == "qwen2" else "LlamaForCausalLM"])
    if fam == "qwen2":
        cfg.update(use_sliding_window=False, sliding_window=None, max_window_layers=layers)
    return cfg


def write_checkpoint(folder: Path, cfg: dict, shards: int = 4) -> int:
    """Random float32 weights with HF names, in `shards` files and their index. Returns the bytes written."""
    import torch
    from safetensors.torch import save_file

    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kvd = h // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    bias = cfg["model_type"] == "qwen2"
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g) * 0.02

    names: list[tuple[str, tuple]] = [("model.embed_tokens.weight", (v, h))]
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        names += [(p + "self_attn.q_proj.weight", (h, h)), (p + "self_attn.k_proj.weight", (kvd, h)),
                  (p + "self_attn.v_proj.weight", (kvd, h)), (p + "self_attn.o_proj.weight", (h, h)),
                  (p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
                  (p + "mlp.down_proj.weight", (h, i)), (p + "input_layernorm.weight", (h,)),
                  (p + "post_attention_layernorm.weight", (h,))]
        if bias:
            names += [(p + "self_attn.q_proj.bias", (h,)), (p + "self_attn.k_proj.bias", (kvd,)),
                      (p + "self_attn.v_proj.bias", (kvd,))]
    names += [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]
    total = sum(torch.Size(s).numel() * 4 for _, s in names)
    per = total / shards
    weight_map, part, size, k = {}, {}, 0, 0

    def flush():
        nonlocal part, size, k
        k += 1
        fname = f"model-{k:05d}-of-{shards:05d}.safetensors"
        save_file(part, str(folder / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
        part, size = {}, 0

    for name, shape in names:
        t = rnd(*shape) if not name.endswith("layernorm.weight") and name != "model.norm.weight" else torch.ones(shape)
        part[name] = t
        size += t.numel() * 4
        if size >= per and k < shards - 1:
            flush()
    flush()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                     "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(cfg))
    return total


def child(kind: str, folder: Path, threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", CHILD, kind, str(folder)], capture_output=True, text=True, env=env,
                         cwd=str(ROOT), timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(res: dict, total: int, fam: str, cfg: dict, shards: list[int]) -> str:
    raw = statistics.median(r["s"] for r in res["raw"])
    gb = 1e9
    lines = [f"Checkpoint: random {fam}-shaped, {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
             f"{total / gb:.2f} GB float32 in {len(shards)} shards (largest {max(shards) / gb:.2f} GB); "
             f"{len(res['raw'])} runs each, interleaved, fresh process each; page cache warm for all.", "",
             "Time: the load call, then every weight read once (a value per 4 kB page: memory-mapped tensors "
             "are read from the file only when used); '× raw read' compares the latter.", "",
             "| load | load call s | loaded + read s, median (min-max) | × raw read | GB/s | peak RSS GB | "
             "RSS after imports GB | load's own RSS GB |",
             "|---|---|---|---|---|---|---|---|"]
    for kind, label in (("raw", "raw read of the files"), ("ours", "attn_explorer.load_model"),
                        ("transformers", "transformers from_pretrained")):
        rs = res[kind]
        s = [r["s"] for r in rs]
        med = statistics.median(s)
        peak = statistics.median(r["peak_rss"] for r in rs)
        base = statistics.median(r["rss_after_imports"] for r in rs)
        call = statistics.median(r["call_s"] for r in rs)
        lines.append(f"| {label} | {call:.2f} | {med:.2f} ({min(s):.2f}-{max(s):.2f}) | {med / raw:.2f} | "
                     f"{total / med / gb:.2f} | "
                     f"{peak / gb:.2f} | {base / gb:.2f} | {(peak - base) / gb:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--gb", type=float, default=1.5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench_sharded_"))
    try:  # written by a child: this process stays small, so the children's ru_maxrss is their own
        w = subprocess.run([sys.executable, "-c", WRITER, str(tmp), str(args.gb), str(ROOT)], capture_output=True,
                           text=True, timeout=900)
        if w.returncode != 0:
            raise SystemExit(f"writing the checkpoint failed:\n{w.stderr[-3000:]}")
        made = json.loads(w.stdout.strip().splitlines()[-1])
        fam, cfg, total = made["family"], made["cfg"], made["total"]
        shards = [f.stat().st_size for f in sorted(tmp.glob("*.safetensors"))]
        res: dict[str, list] = {"raw": [], "ours": [], "transformers": []}
        for _ in range(args.runs):
            for kind in res:
                res[kind].append(child(kind, tmp, args.threads))
        text = table(res, total, fam, cfg, shards)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(text)
    if args.out:
        Path(args.out).write_text(f"# Sharded load\n\n{MARKER}\n\n{text}\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
