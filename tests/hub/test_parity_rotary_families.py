"""The rotary decoders beyond Llama (Qwen2/2.5, Qwen3, Mistral, Phi-3, GPT-NeoX/Pythia) against
transformers eager: tiny seeded random configs saved with save_pretrained, loaded through our public
loader into the one Llama-style decoder, attention maps and the last hidden state within 1e-5 in
float32. Sliding windows are shorter than the input (their masked weights are exactly 0), and greedy
generation through our KV cache picks transformers' tokens."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.tiny_llama import train_tokenizer  # noqa: E402

TOL = 1e-5
N = 23  # tokens per test sequence: longer than every window below
VOCAB = 300  # train_tokenizer's vocabulary

COMMON = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=6,
              max_position_embeddings=128, attn_implementation="eager", bos_token_id=1, eos_token_id=2,
              pad_token_id=0, initializer_range=0.2)

# name -> (transformers config class, model class, config overrides)
CASES = {
    # q, k, v biases without a W_O bias; grouped-query attention
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2)),
    # a window of 5 on the layers from max_window_layers=1 up; layer 0 sees everything
    "qwen2-window": ("Qwen2Config", "Qwen2ForCausalLM",
                     dict(num_key_value_heads=3, use_sliding_window=True, sliding_window=5, max_window_layers=1,
                          tie_word_embeddings=True)),
    # q/k RMSNorm per head before RoPE; head_dim 16 with 6 heads: 96 ≠ hidden_size 48
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_key_value_heads=2, head_dim=16, rope_theta=1000.0)),
    "qwen3-bias": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_key_value_heads=3, attention_bias=True)),
    # every layer's window (6) is shorter than the input
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=2, sliding_window=6)),
    "mistral-full": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=3, sliding_window=None)),
    # fused qkv_proj (grouped) and gate_up_proj; with and without a window
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(num_key_value_heads=2)),
    "phi3-window": ("Phi3Config", "Phi3ForCausalLM", dict(num_key_value_heads=3, sliding_window=7)),
    # Phi-4-mini's kind: RoPE on half of each head's dimensions
    "phi3-partial": ("Phi3Config", "Phi3ForCausalLM", dict(num_key_value_heads=2, partial_rotary_factor=0.5)),
    # partial rotary (a quarter of d_k = 8: 2 dims), parallel residual, LayerNorm with bias, per-head fused qkv
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(rotary_pct=0.25, use_parallel_residual=True,
                                                             hidden_act="gelu")),
    "gpt_neox-sequential": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                            dict(rotary_pct=0.5, use_parallel_residual=False, hidden_act="gelu", rotary_emb_base=500)),
}
WINDOWS = {"qwen2-window": [None, 5, 5], "mistral": [6, 6, 6], "phi3-window": [7, 7, 7]}
ROTATED = {"gpt_neox": 2, "gpt_neox-sequential": 4, "phi3-partial": 4}  # of d_k = 8 (others: all of d_k)


def make_folder(folder, name: str, cases: dict = CASES, common: dict = COMMON, seed: int = 0):
    """transformers' model for cases[name], every weight moved off its init (norms and biases too),
    saved with save_pretrained next to a trained tokenizer. Returns the model."""
    cfg_cls, model_cls, overrides = cases[name]
    torch.manual_seed(seed + sorted(cases).index(name))
    cfg = getattr(transformers, cfg_cls)(**{**common, **overrides})
    hf = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(folder, safe_serialization=True)
    train_tokenizer().save(str(folder / "tokenizer.json"))
    return hf


def per_name(tmp_path_factory, make):
    """name -> make(a fresh folder, name), each made once."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = make(tmp_path_factory.mktemp(name), name)
        return cache[name]

    return get


def folders(tmp_path_factory, make=make_folder):
    """name -> (transformers' model, its folder), each made once by make(folder, name)."""
    return per_name(tmp_path_factory, lambda folder, name: (make(folder, name), folder))


def built_fixture(make):
    """A module-scoped `built` fixture for a test file (`built = built_fixture(make_folder)`): name ->
    (transformers' model, its folder), each made once by make(folder, name)."""

    @pytest.fixture(scope="module", name="built")
    def fixture(tmp_path_factory):
        return folders(tmp_path_factory, make)

    return fixture


def loaded(tmp_path_factory, make):
    """name -> our model, loaded once from a folder that make(folder, name) filled."""

    def load(folder, name):
        make(folder, name)
        return ax.load_model(str(folder), device="cpu")

    return per_name(tmp_path_factory, load)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return folders(tmp_path_factory)


def _base(hf):
    return hf.gpt_neox if hasattr(hf, "gpt_neox") else hf.model


def max_differences(hf, m, ids):
    """(max |ours - transformers| over every layer's attention map, over the last hidden state)."""
    with torch.no_grad():
        ref = _base(hf)(input_ids=ids, output_attentions=True)
    with torch.inference_mode():
        ours = m.module(input_ids=ids, output_attentions=True)
    assert ours.attentions.shape[1] == len(ref.attentions)
    att = max((ours.attentions[:, i] - a).abs().max().item() for i, a in enumerate(ref.attentions))
    return att, (ours.hidden - ref.last_hidden_state).abs().max().item(), ours


def check_parity(hf, m, name, ids, tol=TOL, label=None):
    """Every layer's map and the last hidden state within tol of transformers' (the figures printed as
    "label: maps X hidden Y", label defaulting to name), the logits within 1e-4. Returns our output."""
    att, hidden, ours = max_differences(hf, m, ids)
    print(f"{label or name}: maps {att:.2e} hidden {hidden:.2e}")
    assert att <= tol and hidden <= tol, (name, att, hidden)
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
    with torch.inference_mode():
        logits = m.module.logits(ours.hidden)
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4, msg=name)
    return ours


PROMPT = "The capital of France is Paris. The capital of Italy"


def greedy_steps(hf, m, max_new_tokens, prompt=PROMPT):
    """m.generate's greedy steps for prompt, asserted equal to transformers' greedy tokens (no stop token,
    as many as ours). Returns (the generation, its steps)."""
    g = m.generate(prompt, max_new_tokens=max_new_tokens)
    steps = list(g)
    with torch.no_grad():
        out = hf.generate(torch.tensor([g.prompt_ids]), max_new_tokens=len(steps), do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    assert [s.token_id for s in steps] == out[0, len(g.prompt_ids):].tolist(), prompt
    return g, steps


@pytest.mark.parametrize("name", list(CASES))
def test_rotary_family_parity_with_transformers(built, name):
    hf, folder = built(name)
    m = ax.load_model(str(folder), device="cpu")
    family = json.loads((folder / "config.json").read_text())["model_type"]
    assert m.info.family == family and m.info.causal and m.info.can_generate
    assert m.module.cfg.sliding_windows == WINDOWS.get(name)
    assert m.module.cfg.rotary_dim == ROTATED.get(name, m.module.cfg.head_dim)
    ids = torch.randint(3, VOCAB, (2, N), generator=torch.Generator().manual_seed(7))
    att, hidden, ours = max_differences(hf, m, ids)
    assert att <= TOL and hidden <= TOL, (name, att, hidden)
    windows = WINDOWS.get(name) or [None] * m.info.num_layers
    for layer, w in enumerate(windows):  # exactly zero outside each query's window and in the future
        i, j = torch.meshgrid(torch.arange(N), torch.arange(N), indexing="ij")
        shut = (j > i) | ((i - j >= w) if w else torch.zeros_like(j, dtype=torch.bool))
        assert ours.attentions[:, layer][..., shut].abs().max() == 0
        if w:
            assert (ours.attentions[:, layer][..., ~shut] > 0).all()  # and the window itself is seen


def test_the_logits_match_transformers_for_untied_and_tied_heads(built):
    for name in ("qwen2", "qwen2-window", "phi3", "gpt_neox"):
        hf, folder = built(name)
        m = ax.load_model(str(folder), device="cpu")
        assert (m.module.lm_head is None) == bool(hf.config.tie_word_embeddings)
        ids = torch.randint(3, VOCAB, (1, 15), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            ref = hf(input_ids=ids).logits
        with torch.inference_mode():
            logits = m.module.logits(m.module(input_ids=ids).hidden)
        torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4, msg=name)


@pytest.mark.parametrize("name", ["qwen2", "qwen2-window", "mistral", "phi3-window", "gpt_neox"])
def test_greedy_generation_equals_transformers(built, name):
    """Our KV cache with a sliding window shorter than prompt + new tokens: transformers' greedy tokens."""
    hf, folder = built(name)
    m = ax.load_model(str(folder), device="cpu")
    g, steps = greedy_steps(hf, m, max_new_tokens=8)
    assert len(g.prompt_ids) + len(steps) > max(w or 0 for w in WINDOWS.get(name, [0]))
    w = (WINDOWS.get(name) or [None])[-1]
    if w:  # each step's attention row: zero before the window, over every token so far
        for s in steps:
            row = s.attention[-1]  # (H, position + 1)... the last layer
            assert (row[:, : max(0, row.shape[-1] - w)] == 0).all() and (row[:, -w:] > 0).all()


@pytest.mark.parametrize("name", ["mistral", "gpt_neox"])
def test_right_padding_with_a_window(built, name):
    """A padded second sequence: its real query rows and hidden states are transformers' (padded rows
    are never read), the unpadded one's everything."""
    hf, folder = built(name)
    m = ax.load_model(str(folder), device="cpu")
    ids = torch.randint(3, VOCAB, (2, N), generator=torch.Generator().manual_seed(11))
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    with torch.no_grad():
        ref = _base(hf)(input_ids=ids, attention_mask=mask, output_attentions=True)
    with torch.inference_mode():
        ours = m.module(input_ids=ids, attention_mask=mask, output_attentions=True)
    for i, a in enumerate(ref.attentions):
        torch.testing.assert_close(ours.attentions[:, i][0], a[0], atol=TOL, rtol=0)
        torch.testing.assert_close(ours.attentions[:, i][1, :, :15], a[1, :, :15], atol=TOL, rtol=0)
    torch.testing.assert_close(ours.hidden[1, :15], ref.last_hidden_state[1, :15], atol=TOL, rtol=0)
    torch.testing.assert_close(ours.hidden[0], ref.last_hidden_state[0], atol=TOL, rtol=0)


def test_an_unknown_model_type_lists_the_rotary_families(tmp_path):
    make_folder(tmp_path, "qwen2")
    _edit_config(tmp_path, model_type="qwen2_moe")
    with pytest.raises(UserError) as e:
        ax.load_model(str(tmp_path), device="cpu")
    message = str(e.value)
    assert "\n" not in message and "'qwen2_moe'" in message
    assert all(f in message for f in ("gpt_neox", "mistral", "phi3", "qwen2", "qwen3"))


@pytest.mark.parametrize("name", ["mistral", "qwen2-window"])
def test_kv_cache_with_a_window_equals_a_full_recompute(built, name):
    _, folder = built(name)
    module = ax.load_model(str(folder), device="cpu").module
    ids = torch.randint(3, VOCAB, (1, 17), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        full = module(input_ids=ids, output_attentions=True)
        cache = module.new_cache()
        module(input_ids=ids[:, :4], cache=cache)
        for p in range(4, ids.shape[1]):
            out = module(input_ids=ids[:, p:p + 1], output_attentions=True, cache=cache)
            torch.testing.assert_close(out.hidden[:, 0], full.hidden[:, p], atol=TOL, rtol=0)
            torch.testing.assert_close(out.attentions[:, :, :, 0], full.attentions[:, :, :, p, :p + 1],
                                       atol=TOL, rtol=0)


def _edit_config(folder, **changes):
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


@pytest.mark.parametrize("name,changes,words", [
    # RoPE scalings are read (tests/hub/test_rope_scaling.py); broken or unknown ones are refused
    ("phi3", dict(rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 4,
                                   "long_factor": [1.0] * 3}), "long_factor must list 4"),
    ("phi3", dict(rope_parameters=None, rope_scaling={"type": "su", "short_factor": [1.0] * 4}), "long_factor"),
    ("qwen2", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0}), "'yarn' needs factor"),
    ("gpt_neox", dict(rope_parameters={"rope_type": "dynamic-ntk", "factor": 2.0}), "'dynamic-ntk'"),
    ("mistral", dict(sliding_window=0), "sliding_window"),
    ("qwen2-window", dict(layer_types=["full_attention", "sliding_attention"]), "layer_types"),
    ("gpt_neox", dict(rope_parameters={"rope_type": "default", "partial_rotary_factor": 1.5}), "rotary"),
])
def test_what_we_do_not_implement_is_refused_in_one_line(tmp_path, name, changes, words):
    make_folder(tmp_path, name)
    _edit_config(tmp_path, **changes)
    with pytest.raises(UserError) as e:
        ax.load_model(str(tmp_path), device="cpu")
    message = str(e.value)
    assert "\n" not in message and words in message, message


def test_pythia_style_config_fields_are_read(tmp_path):
    """A config.json written before transformers 5 (Pythia's own): rotary_pct, rotary_emb_base, no
    rope_parameters. Our rotary share and base come from those."""
    hf = make_folder(tmp_path, "gpt_neox-sequential")
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.pop("rope_parameters")
    cfg.update(rotary_pct=0.5, rotary_emb_base=500)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = ax.load_model(str(tmp_path), device="cpu")
    assert m.module.cfg.rotary_dim == 4 and m.module.cfg.rope_theta == 500.0
    att, hidden, _ = max_differences(hf, m, torch.randint(3, VOCAB, (1, N)))
    assert att <= TOL and hidden <= TOL


@pytest.mark.parametrize("family,max_window_layers,windows", [
    ("qwen2", 2, [None, None, 5]),  # the window from layer 2 up
    ("qwen2", 0, [5, 5, 5]),
    ("qwen3", 1, [None, 5, 5]),
    ("qwen2", None, None),  # no key either: transformers' default 28 is past the last layer
])
def test_qwen_config_without_layer_types_reads_max_window_layers(tmp_path, family, max_window_layers, windows):
    """A config.json written before transformers added layer_types: which layers are windowed comes from
    use_sliding_window, sliding_window and max_window_layers alone, as transformers derives it."""
    cfg_cls, model_cls = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM")}[family]
    old = dict(use_sliding_window=True, sliding_window=5, num_key_value_heads=2)
    if max_window_layers is not None:
        old["max_window_layers"] = max_window_layers
    torch.manual_seed(31)
    hf = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**{**COMMON, **old})).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.pop("layer_types")
    if max_window_layers is None:
        cfg.pop("max_window_layers", None)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert [t == "sliding_attention" for t in hf.config.layer_types] == [w is not None for w in windows or [None] * 3]
    m = ax.load_model(str(tmp_path), device="cpu")
    assert m.module.cfg.sliding_windows == windows
    att, hidden, _ = max_differences(hf, m, torch.randint(3, VOCAB, (2, N), generator=torch.Generator().manual_seed(9)))
    assert att <= TOL and hidden <= TOL, (att, hidden)


def test_attention_scales_the_logits_in_transformers_order():
    """Why phi3-partial (and every d_k = 8 case) drifted to ~1e-5 on some CPUs, while RoPE's tables and
    rotation are transformers' bit for bit: q·(1/√8) rounds each of q's entries, (q·kᵀ)·(1/√8) rounds the
    logits; the two orders part by ~1e-7 relative, and large logits turn that into visible drift. Given
    the same q, k, v, our explicit attention must equal transformers' eager attention."""
    from types import SimpleNamespace

    from transformers.models.phi3.modeling_phi3 import eager_attention_forward

    from attn_explorer.core.attention import scaled_dot_product_attention

    worst = 0.0
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(2, 3, 23, 8, generator=g) * 3 for _ in range(3))  # logits up to ~40
        ref, ref_probs = eager_attention_forward(SimpleNamespace(num_key_value_groups=1, training=False), q, k, v,
                                                 None, scaling=8 ** -0.5)
        out, probs = scaled_dot_product_attention(q, k, v)
        worst = max(worst, (probs - ref_probs).abs().max().item(), (out - ref.transpose(1, 2)).abs().max().item())
    assert worst <= 1e-6, worst  # scaling q first: 1.5e-5 here
