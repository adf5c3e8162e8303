"""The hook API (core.hooks, api.hooks, Model.run_with_cache / run_with_hooks / hooks / trace): the names a
TransformerLens user expects, activations that are the numbers the run used, replacements that change what
comes after them and nothing before, and every bad use refused in one line."""
from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.api.hooks import heads_first  # noqa: E402
from attn_explorer.core import linear  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub.test_ablation_parity import FAMILIES, _hf_run, _input, _max_errors  # noqa: E402
from tests.tiny_llama import make_llama_folder  # noqa: E402

TEXT = "The capital of France is Paris. The capital of Italy is"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = make_llama_folder(tmp_path_factory.mktemp("llama"), num_hidden_layers=3)
    return ax.load_model(str(folder), device="cpu")


@pytest.fixture(scope="module")
def minilm():
    return ax.load_model("minilm")


def test_names_follow_transformer_lens(llama):
    names = llama.hook_names()
    L = llama.info.num_layers
    assert names[0] == "hook_embed" and names[-2:] == ["hook_final", "hook_logits"]
    for i in range(L):
        for point in ("hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_pattern",
                      "attn.hook_z", "hook_attn_out", "hook_mlp_out", "hook_resid_post"):
            assert f"blocks.{i}.{point}" in names
    assert len(names) == 1 + 9 * L + 2 and len(set(names)) == len(names)


def test_an_encoder_has_no_logits_point(minilm):
    names = minilm.hook_names()
    assert "hook_logits" not in names and names[-1] == "hook_final"


def test_cache_holds_what_the_run_used(llama):
    r, cache = llama.run_with_cache(TEXT, hidden=True)
    L, H = llama.info.num_layers, llama.info.num_heads
    N = r.num_tokens
    assert set(cache) == set(llama.hook_names())
    for i in range(L):  # hook_pattern is r.attentions, exactly (the same buffer's numbers)
        np.testing.assert_array_equal(cache.numpy(f"blocks.{i}.attn.hook_pattern")[0], r.attentions[i])
    assert cache["blocks.0.attn.hook_z"].shape == (1, N, H, llama.module.blocks.layers[0].attn.head_dim)
    kv = llama.module.blocks.layers[0].attn.num_kv_heads
    assert kv < H and cache["blocks.0.attn.hook_k"].shape[2] == kv  # before grouped-query repetition
    np.testing.assert_allclose(cache.numpy("hook_final")[0], r.hidden, atol=1e-6)
    # the pattern is softmax(q k^T / sqrt(d)) of the cached q and k (after RoPE), causal
    q, k = (heads_first(cache[f"blocks.1.attn.hook_{p}"], H)[0].double() for p in "qk")
    logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    logits = logits.masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), float("-inf"))
    np.testing.assert_allclose(torch.softmax(logits, -1).numpy(), r.attentions[1], atol=2e-6)
    # the residual stream adds up: pre + attn_out + mlp_out = post, and post feeds the next block
    for i in range(L):
        pre, a, m, post = (cache[f"blocks.{i}.{p}"] for p in ("hook_resid_pre", "hook_attn_out", "hook_mlp_out",
                                                            "hook_resid_post"))
        torch.testing.assert_close(pre + a + m, post, atol=1e-5, rtol=0)
        if i + 1 < L:
            assert torch.equal(post, cache[f"blocks.{i + 1}.hook_resid_pre"])


def test_last_resid_post_through_the_final_norm_and_unembedding_gives_the_logits(llama):
    _, cache = llama.run_with_cache(TEXT)
    last = cache[f"blocks.{llama.info.num_layers - 1}.hook_resid_post"]
    with torch.inference_mode():
        logits = llama.module.logits(llama.module.norm(last))
    torch.testing.assert_close(logits, cache["hook_logits"], atol=1e-5, rtol=0)
    assert cache["hook_logits"].shape[-1] == llama.module.cfg.vocab_size


def test_zeroing_a_head_of_hook_z_equals_ablate(llama):
    def zero(z, name):
        z[:, :, 2] = 0  # in place, on the (B, N, H, d) view

    hooked = llama.run_with_hooks(TEXT, hooks={"blocks.1.attn.hook_z": zero}, hidden=True)
    ablated = llama.run(TEXT, ablate={(1, 2): "zero"}, hidden=True)
    plain = llama.run(TEXT, hidden=True)
    np.testing.assert_array_equal(hooked.attentions, ablated.attentions)
    np.testing.assert_array_equal(hooked.hidden, ablated.hidden)
    assert np.abs(hooked.hidden - plain.hidden).max() > 1e-3


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "gemma3", "vit"])
def test_zeroing_hook_z_equals_transformers_with_w_o_input_zeroed(tmp_path, monkeypatch, name):
    """The hooked transformers model of the ablation parity test (a pre-hook on W_O zeroing a head's slice):
    a user's hook_z hook gives its maps and hidden state."""
    monkeypatch.setattr(linear, "fast_path_enabled", False)
    folder = tmp_path / name
    folder.mkdir()
    hf, d = FAMILIES[name](folder)
    hf.double()
    m = ax.load_model(str(folder), device="cpu")
    m.module.double()
    x, hf_inputs = _input(name, m)

    def zero_heads(z, hook_name):
        z = z.clone()
        z[:, :, 1] = 0
        return z  # a replacement, not an in-place change

    ours = m.run_with_hooks(x, {"blocks.0.attn.hook_z": zero_heads, "blocks.1.attn.hook_z": zero_heads}, hidden=True)
    ref = _hf_run(hf, d, hf_inputs, {(0, 1): "zero", (1, 1): "zero"})
    plain_err = _max_errors(m.run(x, hidden=True), _hf_run(hf, d, hf_inputs, {}))
    err = _max_errors(ours, ref)
    assert err[0] <= max(1e-6, 3 * plain_err[0]) and err[1] <= max(1e-6, 3 * plain_err[1]), (name, err, plain_err)


def test_a_replacement_changes_everything_downstream_and_nothing_upstream(llama):
    _, before = llama.run_with_cache(TEXT)

    def shift(x, name):
        return x + 0.5

    with llama.hooks({"blocks.1.hook_attn_out": shift}):
        r, after = llama.run_with_cache(TEXT)
    order = llama.hook_names()
    at = order.index("blocks.1.hook_attn_out")
    for name in order:
        same = torch.equal(before[name], after[name])
        if order.index(name) < at:
            assert same, f"{name} (upstream) moved"
    # the hooked point itself (the cache sees the replacement) and every point after it in the stream
    torch.testing.assert_close(after["blocks.1.hook_attn_out"], before["blocks.1.hook_attn_out"] + 0.5)
    for name in ("blocks.1.hook_mlp_out", "blocks.1.hook_resid_post", "blocks.2.attn.hook_pattern",
                 "blocks.2.attn.hook_z", "hook_final", "hook_logits"):
        assert not torch.allclose(before[name], after[name]), f"{name} (downstream) did not move"
    # the block's own attention ran before its attn_out: unchanged
    assert torch.equal(before["blocks.1.attn.hook_pattern"], after["blocks.1.attn.hook_pattern"])
    plain = llama.run(TEXT)  # the block is closed: no hook any more
    np.testing.assert_array_equal(plain.attentions[2], before["blocks.2.attn.hook_pattern"][0].numpy())


def test_a_pattern_replacement_is_what_the_values_are_weighted_with(llama):
    N = llama.prepare(TEXT).inputs["input_ids"].shape[1]
    uniform = torch.ones(N, N).tril()
    uniform = uniform / uniform.sum(-1, keepdim=True)

    def flat(p, name):
        return uniform.expand_as(p).to(p.dtype).clone()

    r, cache = llama.run_with_cache(TEXT, names=lambda n: n.startswith("blocks.0."))
    hooked = llama.run_with_hooks(TEXT, {"blocks.0.attn.hook_pattern": flat})
    np.testing.assert_allclose(hooked.attentions[0], np.broadcast_to(uniform.numpy(), hooked.attentions[0].shape),
                               atol=1e-7)
    H = llama.info.num_heads
    v = heads_first(cache["blocks.0.attn.hook_v"], H)[0]  # (H, N, d)
    with llama.hooks({"blocks.0.attn.hook_pattern": flat}):
        _, c2 = llama.run_with_cache(TEXT, names=["blocks.0.attn.hook_z"])
    torch.testing.assert_close(heads_first(c2["blocks.0.attn.hook_z"], H)[0], uniform @ v, atol=1e-6, rtol=0)
    assert np.abs(hooked.attentions[1] - r.attentions[1]).max() > 1e-4


def test_names_filter_and_cache_errors(llama):
    r, cache = llama.run_with_cache(TEXT, names=["blocks.0.attn.hook_q", "hook_final"])
    assert set(cache) == {"blocks.0.attn.hook_q", "hook_final"}
    with pytest.raises(KeyError, match="was not cached"):
        cache["blocks.1.attn.hook_q"]
    with pytest.raises(KeyError, match="did you mean 'blocks.0.attn.hook_z'"):
        cache["blocks.0.attn.hook_zz"]
    _, only_z = llama.run_with_cache(TEXT, names=lambda n: n.endswith("hook_z"))
    assert sorted(only_z) == [f"blocks.{i}.attn.hook_z" for i in range(llama.info.num_layers)]


@pytest.mark.parametrize("call", [
    lambda m: m.run_with_cache(TEXT, names=["blocks.9.attn.hook_z"]),
    lambda m: m.run_with_cache(TEXT, names=["blocks.0.attn.hook_zz"]),
    lambda m: m.run_with_cache(TEXT, names=[3]),
    lambda m: m.run_with_hooks(TEXT, {"blocks.0.hook_resid": lambda x, n: None}),
    lambda m: m.run_with_hooks(TEXT, {"blocks.0.attn.hook_z": "not a function"}),
    lambda m: m.run_with_hooks(TEXT, {"blocks.0.attn.hook_z": lambda z, n: z[:, :1]}),
    lambda m: m.run_with_hooks(TEXT, {"blocks.0.attn.hook_z": lambda z, n: 3.0}),
    lambda m: m.run_with_hooks(TEXT, {}, colour="red"),
    lambda m: m.run_with_cache(TEXT, names=["blocks.0.attn.hook_pattern"], lazy=True),
    lambda m: m.run_with_hooks(TEXT, {"blocks.0.attn.hook_pattern": lambda p, n: None}, lazy=True),
])
def test_bad_hooks_are_one_line(llama, call):
    with pytest.raises(UserError) as e:
        call(llama)
    assert "\n" not in str(e.value)


def test_a_bad_hook_leaves_the_model_as_it_was(llama):
    before = llama.run(TEXT)
    with pytest.raises(UserError):
        llama.run_with_hooks(TEXT, {"blocks.0.attn.hook_z": lambda z, n: z[:, :1]})
    with pytest.raises(UserError):
        with llama.hooks({"blocks.0.attn.hook_z": lambda z, n: z[:, :1]}):
            llama.run(TEXT)
    np.testing.assert_array_equal(llama.run(TEXT).attentions, before.attentions)


def test_a_lazy_run_caches_everything_but_the_pattern(llama):
    dense, dc = llama.run_with_cache(TEXT, hidden=True)
    r, cache = llama.run_with_cache(TEXT, lazy=True, hidden=True)
    assert r.lazy is not None and "blocks.0.attn.hook_pattern" not in cache
    with pytest.raises(KeyError, match="was not cached"):
        cache["blocks.0.attn.hook_pattern"]
    for name in ("blocks.2.attn.hook_z", "blocks.1.hook_resid_post", "hook_logits"):
        torch.testing.assert_close(cache[name], dc[name], atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(r.attention(1, 0), dense.attentions[1, 0], atol=1e-6, rtol=1e-5)


def test_hooks_on_an_image_model_and_in_bfloat16(minilm):
    from PIL import Image

    vit = ax.load_model("tiny-vit-digits")
    img = Image.fromarray((np.random.default_rng(0).random((8, 8, 3)) * 255).astype(np.uint8))
    r, cache = vit.run_with_cache(img, names=lambda n: "pattern" in n or n == "hook_final", hidden=True)
    assert len(cache) == vit.info.num_layers + 1
    for i in range(vit.info.num_layers):
        np.testing.assert_array_equal(cache.numpy(f"blocks.{i}.attn.hook_pattern")[0], r.attentions[i])
    np.testing.assert_allclose(cache.numpy("hook_final")[0], r.hidden, atol=1e-6)
    m16 = ax.load_model("minilm", dtype="bfloat16")
    r, cache = m16.run_with_cache("the cat sat on the mat", names=["blocks.0.attn.hook_z", "blocks.5.attn.hook_pattern"])
    assert cache["blocks.0.attn.hook_z"].dtype == torch.bfloat16
    np.testing.assert_allclose(cache.numpy("blocks.5.attn.hook_pattern")[0], r.attentions[5], atol=1e-2)
    z = m16.run_with_hooks("the cat sat on the mat", {"blocks.0.attn.hook_z": lambda z, n: torch.zeros_like(z)})
    assert np.abs(z.attentions[1] - r.attentions[1]).max() > 1e-3


def test_trace_is_what_analyses_use(llama):
    prep = llama.prepare(TEXT)
    t = llama.trace(prep, names=["hook_logits"], attentions=True)
    assert t.out.attentions.shape[:2] == (1, llama.info.num_layers) and t.logits is not None
    torch.testing.assert_close(t.cache["hook_logits"], t.logits)
    lazy = llama.trace(prep, lazy=True)
    assert lazy.lazy is not None and lazy.out.attentions is None


def test_generation_runs_the_hooks_of_an_open_block(llama):
    """`with m.hooks(...)` around a generation steers every step (here: hook_logits pushes one token up)."""
    plain = [s.token_id for s in llama.generate(TEXT, max_new_tokens=4)]
    target = next(t for t in range(10, 100) if t not in plain)

    def boost(logits, name):
        logits[..., target] += 1e4

    with llama.hooks({"hook_logits": boost}):
        steered = [s.token_id for s in llama.generate(TEXT, max_new_tokens=4)]
    assert steered == [target] * 4
    assert [s.token_id for s in llama.generate(TEXT, max_new_tokens=4)] == plain  # the block closed: as before


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert", "electra", "gpt2", "opt", "llama", "qwen2-window",
                                    "qwen3", "mistral", "phi3", "gpt_neox", "gemma2 (soft-capping, windows)",
                                    "gemma3 (qk-norm, windows)", "clip_text", "smollm3 (NoPE layers)",
                                    "granite (multipliers)", "olmo3 (post-norms, windows)",
                                    "modernbert (two-sided windows)", "llama4 (chunks, NoPE, MoE)",
                                    "gpt_oss (sinks, windows)",
                                    "deepseek_v3 (latent attention, MoE)", "qwen3_moe (MoE, a dense layer)"])
def test_every_text_family_names_its_pattern_and_output(tmp_path, family):
    """For every family: hook_pattern is the map the forward returned, and zeroing every head of hook_z in the
    last layer leaves its maps as they were while the hidden state moves."""
    from tests.api.test_lazy import TEXT as FAMILIES_TEXT, _load

    m = _load(tmp_path, FAMILIES_TEXT[family])
    assert m.hook_names()[:2] == ["hook_embed", "blocks.0.hook_resid_pre"]
    inputs = {"input_ids": torch.randint(3, 99, (1, 17), generator=torch.Generator().manual_seed(0))}
    t = m.trace(inputs, names=lambda n: n.endswith("hook_pattern"), attentions=True)
    for i in range(m.info.num_layers):
        torch.testing.assert_close(t.cache[f"blocks.{i}.attn.hook_pattern"], t.out.attentions[:, i], atol=0, rtol=0)
    last = m.info.num_layers - 1
    off = m.trace(inputs, {f"blocks.{last}.attn.hook_z": lambda z, n: torch.zeros_like(z)}, attentions=True)
    torch.testing.assert_close(off.out.attentions, t.out.attentions, atol=0, rtol=0)
    assert (off.out.hidden - t.out.hidden).abs().max() > 1e-4


def test_a_model_with_hooks_can_be_copied(llama):
    import copy

    twin = copy.deepcopy(llama)
    with twin.hooks({"blocks.0.attn.hook_z": lambda z, n: torch.zeros_like(z)}):
        assert np.abs(twin.run(TEXT).attentions[1] - llama.run(TEXT).attentions[1]).max() > 1e-4
