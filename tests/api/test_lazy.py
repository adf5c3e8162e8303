"""Lazy attention through the API: every family's maps computed again from q, k and lse equal the dense
maps, a 20,000-token input runs with bounded memory, and `r.attentions` of a lazy run refuses in one line."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.api import model as api_model  # noqa: E402
from attn_explorer.api.lazy import LazyAttention, kept_bytes  # noqa: E402
from attn_explorer.api.result import NotKept  # noqa: E402
from attn_explorer.core import lazy as core_lazy  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.tiny_llama import make_llama_folder  # noqa: E402

# Probabilities: 1e-6, plus 1e-5 relative. These tiny models' weights are spread wide: logits reach |10|-|18|,
# where float32 rounds a logit by ~5e-7; the dense maps themselves are up to 2.6e-6 off float64 there (tiny
# Gemma 3, layer 2; ours 2.2e-6), so two float32 computations of one map agree only to about that.
ATOL, RTOL = 1e-6, 1e-5
# a later layer's maps: its input is a hidden state that the dense and lazy paths' kernels round apart (within the
# 1e-5 that the hidden-state checks allow); measured 2.6e-6 on an Intel Xeon (Llama 4 with MoE, layer 3, 1.03× the
# first layer's bound above, which it passed on an AMD EPYC)
LATER_ATOL = 1e-5


# ---- tiny random checkpoints of every family ------------------------------------------------------

def _spread(hf, std=0.3):
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or "token" in name or "position_embeddings" in name or "lambda1" in name:
                p.normal_(std=std) if not name.endswith("weight") or "norm" not in name else p.copy_(1 + std * torch.randn_like(p))
    return hf.eval()


def _text_families():
    from tests.hub.test_parity_rotary_families import CASES, COMMON

    def rotary(name):
        cfg_cls, model_cls, over = CASES[name]
        return getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**{**COMMON, **over}))

    enc = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
               max_position_embeddings=64, attn_implementation="eager", initializer_range=0.3)
    gemma = dict(vocab_size=99, hidden_size=32, intermediate_size=37, num_attention_heads=4, head_dim=16,
                 max_position_embeddings=64, sliding_window=5, initializer_range=0.3, attn_implementation="eager")
    return {
        "bert": lambda: transformers.BertModel(transformers.BertConfig(**enc)),
        "roberta": lambda: transformers.RobertaModel(transformers.RobertaConfig(pad_token_id=1, type_vocab_size=1, **enc)),
        "distilbert": lambda: transformers.DistilBertModel(transformers.DistilBertConfig(
            vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=40, max_position_embeddings=64,
            initializer_range=0.3, attn_implementation="eager")),
        "electra": lambda: transformers.ElectraModel(transformers.ElectraConfig(embedding_size=16, **enc)),
        "gpt2": lambda: transformers.GPT2Model(transformers.GPT2Config(
            vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64, attn_implementation="eager",
            initializer_range=0.3)),
        "opt": lambda: transformers.OPTModel(transformers.OPTConfig(
            vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=48,
            max_position_embeddings=64, word_embed_proj_dim=32, init_std=0.3, attn_implementation="eager",
            pad_token_id=1, bos_token_id=2, eos_token_id=2)),
        "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
            **{**COMMON, "num_key_value_heads": 2})),
        **{name: (lambda name=name: rotary(name)) for name in
           ("qwen2-window", "qwen3", "mistral", "phi3", "gpt_neox")},
        "gemma2 (soft-capping, windows)": lambda: _spread(transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
            num_hidden_layers=2, num_key_value_heads=2, query_pre_attn_scalar=20, attn_logit_softcapping=2.0, **gemma))),
        "gemma3 (qk-norm, windows)": lambda: _spread(transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
            num_hidden_layers=3, num_key_value_heads=1, query_pre_attn_scalar=12, sliding_window_pattern=3, **gemma))),
        # the 2026 decoders: NoPE layers, Granite's multipliers, norms only after each branch with full-width q/k
        # norms and windows; and ModernBERT's two-sided local windows
        "smollm3 (NoPE layers)": lambda: _spread(transformers.SmolLM3ForCausalLM(transformers.SmolLM3Config(
            **{**COMMON, "num_hidden_layers": 4, "num_key_value_heads": 2}))),
        "granite (multipliers)": lambda: _spread(transformers.GraniteForCausalLM(transformers.GraniteConfig(
            **{**COMMON, "num_key_value_heads": 2, "embedding_multiplier": 6.0, "attention_multiplier": 0.2,
               "residual_multiplier": 0.5, "logits_scaling": 4.0}))),
        "olmo3 (post-norms, windows)": lambda: _spread(transformers.Olmo3ForCausalLM(transformers.Olmo3Config(
            **{**COMMON, "num_hidden_layers": 4, "num_key_value_heads": 2, "sliding_window": 5}))),
        "modernbert (two-sided windows)": lambda: _spread(transformers.ModernBertModel(transformers.ModernBertConfig(
            vocab_size=99, hidden_size=32, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
            global_attn_every_n_layers=3, local_attention=4, max_position_embeddings=64, pad_token_id=0,
            attn_implementation="eager"))),
        # gpt-oss: learned sinks (the kept lse includes them), windows, q/k/v/o biases, the MoE MLP
        "gpt_oss (sinks, windows)": lambda: _spread(transformers.GptOssForCausalLM(transformers.GptOssConfig(
            **{**COMMON, "num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 8, "sliding_window": 5,
               "intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2}))),
        # DeepSeek-V3: multi-head latent attention (lazy keeps the latent, not every head's k) and MoE layers
        "deepseek_v3 (latent attention, MoE)": lambda: _spread(transformers.DeepseekV3ForCausalLM(
            transformers.DeepseekV3Config(**{**COMMON, "num_key_value_heads": 6, "kv_lora_rank": 16, "q_lora_rank": 12,
                                             "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 10,
                                             "first_k_dense_replace": 1, "n_routed_experts": 8, "n_group": 2,
                                             "topk_group": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 24}))),
        # Llama 4: chunked attention (chunks of 5) on its RoPE layers, a NoPE layer with tuned queries, q/k norm
        # after RoPE, MoE on alternate layers
        "llama4 (chunks, NoPE, MoE)": lambda: _spread(transformers.Llama4ForCausalLM(transformers.Llama4TextConfig(
            **{**COMMON, "num_hidden_layers": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size_mlp": 40,
               "attention_chunk_size": 5, "interleave_moe_layer_step": 2, "num_local_experts": 4, "floor_scale": 4,
               "attn_scale": 0.5}))),
        # Qwen3-MoE: routed experts (softmax top-k) on layers 0 and 2, Qwen3's dense MLP on layer 1
        "qwen3_moe (MoE, a dense layer)": lambda: _spread(transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
            **{**COMMON, "num_hidden_layers": 3, "num_key_value_heads": 2, "head_dim": 8, "moe_intermediate_size": 16,
               "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True, "mlp_only_layers": [1],
               "experts_implementation": "eager"}))),
        "clip_text": lambda: transformers.CLIPTextModel(transformers.CLIPTextConfig(
            vocab_size=99, hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37,
            max_position_embeddings=64, attn_implementation="eager", bos_token_id=0, eos_token_id=2, pad_token_id=1)),
    }


def _image_families():
    from tests.hub.test_parity import _vision_model

    vision = dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37, image_size=16,
                  patch_size=4, attn_implementation="eager")
    return {
        "vit": lambda: _vision_model("vit", 4, 16, 3),
        "deit": lambda: _vision_model("deit", 4, 16, 3),
        "dinov2": lambda: _vision_model("dinov2", 14, 56, 3),
        "clip": lambda: transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**vision)),
        "siglip": lambda: transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**vision)),
    }


TEXT = _text_families()
IMAGE = _image_families()


def _load(tmp_path, build):
    torch.manual_seed(0)
    hf = build().eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf.save_pretrained(tmp_path / "m", safe_serialization=True)
    return ax.load_model(str(tmp_path / "m"), device="cpu")


def _both(m, inputs, dk_scale=1.0, dk_layers=None):
    """The module's dense maps (B, L, H, N, N) and hidden state, and what a lazy forward kept (its store)."""
    dense = m.trace(inputs, dk_scale=dk_scale, dk_layers=dk_layers, attentions=True).out
    t = m.trace(inputs, dk_scale=dk_scale, dk_layers=dk_layers, lazy=True)
    assert t.out.attentions is None and isinstance(t.lazy, LazyAttention)
    assert t.lazy.num_layers == m.info.num_layers
    return dense, t.out, t.lazy


def _assert_same_maps(dense, store, rows_of=None):
    """Every head of every layer, every batch row, against the dense maps (rows_of[b]: the real query rows)."""
    B, L, H, N, M = dense.attentions.shape
    for layer in range(L):
        c = store.layers[layer]
        for b in range(B):
            for h in range(H):
                got = core_lazy.head_probs(c.q, c.k, c.lse, c.options, h, batch=b)
                want = dense.attentions[b, layer, h]
                n = N if rows_of is None else rows_of[b]
                torch.testing.assert_close(got[:n], want[:n], atol=ATOL if layer == 0 else LATER_ATOL, rtol=RTOL,
                                           msg=f"L{layer} H{h} batch {b}")


@pytest.mark.parametrize("family", list(TEXT))
def test_lazy_equals_dense_for_every_text_family(tmp_path, family):
    """Causal or not, GQA, windows, soft-capping, qk-norm: with right padding in batch row 1 and the d_k
    slider (0.7) on layer 1 only."""
    m = _load(tmp_path, TEXT[family])
    torch.manual_seed(1)
    ids = torch.randint(3, 99, (2, 29))
    mask = torch.ones_like(ids)
    mask[1, 21:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    dense, lazy, store = _both(m, inputs, dk_scale=0.7, dk_layers=[1])
    _assert_same_maps(dense, store, rows_of=[29, 21])  # padded query rows are never read
    torch.testing.assert_close(lazy.hidden[0], dense.hidden[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lazy.hidden[1, :21], dense.hidden[1, :21], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", list(IMAGE))
def test_lazy_equals_dense_for_every_image_family(tmp_path, family):
    m = _load(tmp_path, IMAGE[family])
    torch.manual_seed(2)
    side = 56 if family == "dinov2" else 16
    dense, lazy, store = _both(m, {"pixels": torch.randn(1, 3, side, side)})
    _assert_same_maps(dense, store)
    torch.testing.assert_close(lazy.hidden, dense.hidden, atol=1e-5, rtol=1e-5)


def test_a_2048_token_gemma3_with_local_and_global_layers(tmp_path):
    """n = 2,048 through a tiny Gemma 3 (window 300 on two layers of three): the store's whole heads, pooled
    views and windows against the float64 maps of the q and k it holds (the dense run's later layers see
    hidden states 1e-5 apart, so only its layer 0 is the same map), and the layers' windows."""
    from attn_explorer.maths import pool2d

    gemma = dict(vocab_size=99, hidden_size=32, intermediate_size=37, num_attention_heads=2, num_key_value_heads=1,
                 head_dim=16, max_position_embeddings=2048, sliding_window=300, initializer_range=0.3,
                 attn_implementation="eager", num_hidden_layers=3, query_pre_attn_scalar=12, sliding_window_pattern=3)
    m = _load(tmp_path, lambda: _spread(transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**gemma))))
    ids = torch.randint(3, 99, (1, 2048), generator=torch.Generator().manual_seed(3))
    dense, _, store = _both(m, {"input_ids": ids})
    assert [store.window(i) for i in range(3)] == [300, 300, None]
    band = ~core_lazy._band_mask(slice(0, 2048), slice(0, 2048), 2048, 2048, True, 300, None)
    for layer in range(3):
        lz = store.layers[layer]
        for h in range(2):
            s = (lz.q[0, h].double() @ lz.k[0, 0].double().T) * lz.options.scale
            s = s.masked_fill(band if lz.options.window else torch.ones_like(band).triu(1), float("-inf"))
            exact = torch.softmax(s, dim=-1).numpy()  # logits reach |20|: float32's lse is ~3e-6 off there
            np.testing.assert_allclose(store.attention(layer, h), exact, atol=5e-6, rtol=0)
            if h:
                continue
            np.testing.assert_allclose(store.attention(layer, h, pool=512), pool2d(exact, 512, 512), atol=5e-6, rtol=0)
            np.testing.assert_allclose(store.attention(layer, h, rows=(1700, 1956), cols=(1500, 1756)),
                                       exact[1700:1956, 1500:1756], atol=5e-6, rtol=0)
    np.testing.assert_allclose(store.attention(0, 1), dense.attentions[0, 0, 1].numpy(), atol=5e-6, rtol=0)


# ---- the public API ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = make_llama_folder(tmp_path_factory.mktemp("llama"), max_position_embeddings=20480)
    return ax.load_model(str(folder), device="cpu")


TEXT_IN = "The capital of France is Paris. Attention lets every token look at the tokens before it. "


def test_run_lazy_matches_dense_through_the_api(llama):
    dense, lazy = llama.run(TEXT_IN * 4, lazy=False), llama.run(TEXT_IN * 4, lazy=True, hidden=True)
    assert lazy.is_lazy and not dense.is_lazy and lazy.attentions.shape == dense.attentions.shape
    L, H, N, _ = dense.attentions.shape
    for layer in range(L):
        for h in range(H):
            np.testing.assert_allclose(lazy.attention(layer, h), dense.attentions[layer, h], atol=ATOL, rtol=RTOL)
    for kw in ({"rows": 7}, {"cols": 3}, {"rows": (5, 40), "cols": (0, 9)}, {"pool": 13},
               {"pool": (9, 31), "reduce": "mean"}, {"rows": slice(10, 50), "pool": 8}):
        np.testing.assert_allclose(lazy.attention(1, 4, **kw), dense.attention(1, 4, **kw), atol=ATOL, rtol=RTOL)
    assert lazy.hidden.shape == dense.attentions.shape[2:3] + (llama.info.hidden_size,)
    np.testing.assert_allclose(lazy.hidden, llama.run(TEXT_IN * 4, hidden=True, lazy=False).hidden, atol=1e-5)


def test_a_lazy_causal_runs_first_row_and_last_column_equal_the_dense_map(llama):
    """The edges of a causal map, where an off-by-one in the causal band or a row/column kernel shows: query 0
    sees only key 0 (its row is [1, 0, ...]); key N-1 is seen only by query N-1 (its column is 0 above the
    last row). Asked as an int, as a one-wide span and inside a pool, in every head of every layer."""
    dense, lazy = llama.run(TEXT_IN * 2, lazy=False), llama.run(TEXT_IN * 2, lazy=True)
    assert lazy.is_lazy and llama.info.causal
    L, H, N, _ = dense.attentions.shape
    one_hot = np.zeros(N, np.float32)
    one_hot[0] = 1
    for layer in range(L):
        for h in range(H):
            first, last = dense.attentions[layer, h, 0], dense.attentions[layer, h, :, N - 1]
            np.testing.assert_allclose(first, one_hot, atol=ATOL, rtol=0)  # the dense map itself: causal
            assert (last[:-1] == 0).all() and last[-1] > 0
            for got in (lazy.attention(layer, h, rows=0), lazy.attention(layer, h, rows=(0, 1))[0]):
                np.testing.assert_allclose(got, first, atol=ATOL, rtol=RTOL, err_msg=f"L{layer} H{h} row 0")
            for got in (lazy.attention(layer, h, cols=N - 1), lazy.attention(layer, h, cols=(N - 1, N))[:, 0]):
                np.testing.assert_allclose(got, last, atol=ATOL, rtol=RTOL, err_msg=f"L{layer} H{h} column {N - 1}")
            np.testing.assert_allclose(lazy.attention(layer, h, pool=(N, 1))[:, 0], dense.attentions[layer, h].max(1),
                                       atol=ATOL, rtol=RTOL)  # pooled to one column: each row's largest


def test_one_weight_of_a_lazy_run_is_the_dense_weight(llama):
    """rows and cols both ints: one weight, as RunResult.attention gives it for a dense run (a 0-d array).
    The corners of a causal map: (0, 0) is 1, (0, N-1) is 0, (N-1, N-1) is the last token's own weight."""
    dense, lazy = llama.run(TEXT_IN, lazy=False), llama.run(TEXT_IN, lazy=True)
    N = dense.num_tokens
    for i, j in ((0, 0), (0, N - 1), (N - 1, N - 1), (N - 1, 0)):
        want = dense.attention(1, 4, rows=i, cols=j)
        np.testing.assert_allclose(lazy.attention(1, 4, rows=i, cols=j), want, atol=ATOL, rtol=RTOL)


def test_attentions_of_a_lazy_run_refuse_in_one_line_but_keep_their_shape(llama):
    r = llama.run(TEXT_IN, lazy=True)
    assert isinstance(r.attentions, NotKept) and r.attentions.shape == (2, 6, r.num_tokens, r.num_tokens)
    assert r.attentions.ndim == 4
    for read in (np.asarray, lambda a: a[0], lambda a: a.max(), lambda a: a * 2, lambda a: list(a), lambda a: r.to_bertviz()):
        with pytest.raises(UserError) as e:
            read(r.attentions)
        assert "\n" not in str(e.value) and "r.attention(layer, head" in str(e.value)
    short = llama.run(TEXT_IN)  # a short input keeps its maps, as before
    assert not short.is_lazy and isinstance(short.attentions, np.ndarray) and short.attentions.dtype == np.float32


def test_bad_requests_are_one_line(llama):
    r = llama.run(TEXT_IN, lazy=True)
    N = r.num_tokens
    for kw, words in (({"layer": 2, "head": 0}, "no head L2 H0"), ({"layer": 0, "head": 6}, "no head L0 H6"),
                      ({"layer": 0, "head": 0, "rows": N}, f"no row {N}"), ({"layer": 0, "head": 0, "pool": 0}, "pool"),
                      ({"layer": 0, "head": 0, "reduce": "sum"}, "reduce")):
        with pytest.raises(UserError, match=words):
            r.attention(**kw)
    with pytest.raises(UserError, match="lazy must be"):
        llama.run(TEXT_IN, lazy="yes")


def test_the_memory_guard_counts_what_is_kept(llama, monkeypatch):
    r = llama.run(TEXT_IN * 3, lazy=True)
    n = r.num_tokens
    expected = kept_bytes(n, n, 2, 6, 2, 8, 4)  # q (6 heads), k (2 heads) of d = 8 in float32, lse
    assert r.lazy.bytes_kept == expected
    dense = 2 * 6 * n * n * 4
    monkeypatch.setattr(api_model, "default_budget", lambda device: dense // 2)  # the maps no longer fit
    auto = llama.run(TEXT_IN * 3)
    assert auto.is_lazy  # automatic: lazy where the maps do not fit
    with pytest.raises(UserError, match="for the attention maps") as e:
        llama.run(TEXT_IN * 3, lazy=False)
    assert "\n" not in str(e.value)
    monkeypatch.setattr(api_model, "default_budget", lambda device: expected - 1)  # not even q and k fit
    with pytest.raises(UserError, match="would keep .* of queries and keys") as e:
        llama.run(TEXT_IN * 3)
    assert "\n" not in str(e.value)


def test_encoder_decoders_stay_dense_with_a_one_line_refusal(llama):
    m = api_model.Model(llama.module, dataclasses.replace(llama.info, encoder_decoder=True), llama.tokenizer)
    with pytest.raises(UserError, match="not supported yet for encoder-decoders"):
        m._keep_lazily(m.prepare(TEXT_IN), True, False, False)


def test_a_20000_token_input_runs_with_bounded_memory(tmp_path):
    """Through load_model and run (a tiny Llama of 2 layers x 2 heads of 24): the maps would take 6.4 GB; the
    run keeps q, k and lse (12 MB, 0.2 % of that), and no n×n array anywhere."""
    folder = make_llama_folder(tmp_path / "long", max_position_embeddings=20480, num_attention_heads=2,
                               num_key_value_heads=1)
    r = ax.load_model(str(folder), device="cpu").run("the cat sat on the mat and attention is all you need " * 2500,
                                                     max_tokens=20000)
    n = r.num_tokens
    assert n == 20000 and r.is_lazy and isinstance(r.attentions, NotKept)
    store = r.lazy
    assert store.bytes_kept == kept_bytes(n, n, 2, 2, 1, 24, 4) < 0.01 * store.dense_bytes
    for layer in store.layers:  # nothing n×n is held, in any layer
        assert all(t.numel() < n * 100 for t in (layer.q, layer.k, layer.lse))
    rows = r.attention(1, 1, rows=(19990, 20000))
    np.testing.assert_allclose(rows.sum(axis=1), 1.0, atol=1e-5)  # causal rows, each summing to 1
    pooled = r.attention(1, 1, pool=(64, 64), reduce="mean")
    assert pooled.shape == (64, 64) and np.triu(pooled, 1).max() == 0


def test_an_image_model_runs_lazily(tmp_path):
    from PIL import Image

    m = _load(tmp_path, IMAGE["dinov2"])
    img = Image.fromarray((np.random.default_rng(0).random((70, 70, 3)) * 255).astype(np.uint8))
    dense, lazy = m.run(img, lazy=False), m.run(img, lazy=True)
    assert lazy.is_lazy and lazy.grid == dense.grid and lazy.tokens == dense.tokens
    np.testing.assert_allclose(lazy.attention(1, 2), dense.attentions[1, 2], atol=ATOL, rtol=RTOL)


def test_the_grid_mosaic_of_a_lazy_run_fills_head_by_head(llama):
    from attn_explorer.api.display import lazy_grid_image, lazy_grid_steps
    from attn_explorer.maths import pool2d

    text = TEXT_IN * 3
    dense, lazy = llama.run(text, lazy=False), llama.run(text, lazy=True)
    L, H, N, _ = dense.attentions.shape
    steps = list(lazy_grid_steps(lazy.lazy, cell_max=32))
    assert [s[:2] for s in steps] == [(i, L * H) for i in range(1, L * H + 1)]
    first = steps[0][2]
    assert first.weights[:32, :32].max() > 0 and first.weights[:, 32:].max() == 0  # only head 0 of layer 0 so far
    g = steps[-1][2]
    want = np.block([[pool2d(dense.attentions[layer, h], 32, 32) for h in range(H)] for layer in range(L)])
    assert (g.layers, g.heads, g.cell) == (L, H, 32) and g.weights.shape == (L * 32, H * 32)
    np.testing.assert_allclose(g.weights, want, atol=ATOL, rtol=RTOL)
    seen = []
    assert lazy_grid_image(lazy.lazy, 32, progress=lambda done, total: seen.append(done)).weights.shape == g.weights.shape
    assert seen == list(range(1, L * H + 1))
    done = []
    assert lazy_grid_image(lazy.lazy, 32, progress=lambda d, t: done.append(d), stop=lambda: len(done) >= 2) is None
    assert done == [1, 2]  # stopped after two heads
