"""Gemma 2 and Gemma 3 on our Llama decoder against transformers in eager mode: tiny random configs
saved with save_pretrained, inputs longer than the sliding window, local and global layers, soft-capping
strong enough to bend the logits, and (1 + w) norms whose weights are not zero."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.api.hooks import caching_hook, heads_first, merge  # noqa: E402
from attn_explorer.core.hooks import Hooks  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from attn_explorer.hub.convert import translate_config  # noqa: E402
from attn_explorer.hub.families import ARCHITECTURES  # noqa: E402
from tests.hub.test_parity import TOL, _compare, _run_ours, _save, linear_path  # noqa: E402,F401
from tests.tiny_llama import train_tokenizer  # noqa: E402

WINDOW = 5
N_TOKENS = 13  # > WINDOW: the local layers' rows are cut, the global ones' are not


def _spread(hf, std=0.3):
    """Random init leaves Gemma's norms at zero (a (1 + w) norm of exactly 1): make them count."""
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.normal_(std=std)
    return hf


def _gemma2(layers=4, **kw):
    cfg = dict(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=layers, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, max_position_embeddings=64, sliding_window=WINDOW,
               query_pre_attn_scalar=20, attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
               initializer_range=0.3, attn_implementation="eager", rope_parameters={"rope_type": "default",
                                                                                     "rope_theta": 1000.0})
    cfg.update(kw)
    torch.manual_seed(0)
    return _spread(transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**cfg)).eval())


def _gemma3(layers=6, vocab=99, **kw):
    cfg = dict(vocab_size=vocab, hidden_size=32, intermediate_size=37, num_hidden_layers=layers, num_attention_heads=4,
               num_key_value_heads=1, head_dim=16, max_position_embeddings=64, sliding_window=WINDOW,
               query_pre_attn_scalar=12, final_logit_softcapping=4.0, sliding_window_pattern=3,
               initializer_range=0.3, attn_implementation="eager",
               rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}})
    cfg.update(kw)
    torch.manual_seed(0)
    return _spread(transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**cfg)).eval())


def _check(hf, m, ids):
    with torch.no_grad():
        ref = hf.model(input_ids=ids, output_attentions=True)
        ref_logits = hf(input_ids=ids).logits
    ours = _run_ours(m, input_ids=ids)
    _compare(ref, ours, hf.config.num_hidden_layers)
    with torch.inference_mode():
        logits = m.module.logits(ours.hidden)
    torch.testing.assert_close(logits, ref_logits, atol=TOL, rtol=0)
    return ours, logits, ref_logits


def _local_layers(hf):
    return [i for i, t in enumerate(hf.config.layer_types) if t == "sliding_attention"]


def test_gemma2_parity(tmp_path, linear_path):
    hf = _gemma2()
    m = ax.load_model(_save(hf, tmp_path, "gemma2"), device="cpu")
    assert m.info.family == "gemma2" and m.info.causal and m.info.can_generate
    ids = torch.randint(0, 99, (2, N_TOKENS))
    ours, logits, _ = _check(hf, m, ids)
    local = _local_layers(hf)
    assert local == [0, 2]  # Gemma 2 alternates: local, global, local, global
    rows = torch.arange(N_TOKENS)
    far = rows[:, None] - rows[None, :] >= WINDOW  # keys out of a local layer's window
    for i in range(4):
        seen = ours.attentions[:, i][..., far]
        assert (seen.abs().max() == 0) == (i in local), i  # global layers do look past the window
    assert logits.abs().max() <= 3.0  # the final soft-cap holds the logits inside ±3
    # the caps change the result: without them transformers' answer is another one
    hf_plain = _gemma2(attn_logit_softcapping=None, final_logit_softcapping=None)
    with torch.no_grad():
        plain = hf_plain.model(input_ids=ids, output_attentions=True)
    assert (plain.attentions[1] - ours.attentions[:, 1]).abs().max() > 1e-3


def test_gemma2_softcapped_probabilities_are_exact(tmp_path):
    """The probabilities the soft-capped layers hand back are softmax(c·tanh(qk·s / c)) itself, and the
    fused path (no maps asked) gives the same hidden state as the explicit one."""
    hf = _gemma2()
    m = ax.load_model(_save(hf, tmp_path, "gemma2"), device="cpu")
    ids = torch.randint(0, 99, (1, N_TOKENS))
    cap = {}
    keep = {f"blocks.1.attn.hook_{p}": caching_hook(cap) for p in "qk"}
    with torch.inference_mode():
        ours = m.module(input_ids=ids, output_attentions=True, hooks=Hooks(merge(keep)))
        fast = m.module(input_ids=ids, output_attentions=False)
    # layer 1 is global: a causal mask only; its 2 key heads serve the 4 query heads
    q, k = (heads_first(cap[f"blocks.1.attn.hook_{p}"], 4) for p in "qk")
    logits = q @ k.transpose(-1, -2) * 20 ** -0.5
    logits = 2.0 * torch.tanh(logits / 2.0)
    logits = logits.masked_fill(torch.ones(N_TOKENS, N_TOKENS, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(ours.attentions[:, 1], torch.softmax(logits, -1), atol=1e-6, rtol=0)
    torch.testing.assert_close(fast.hidden, ours.hidden, atol=1e-6, rtol=0)


def test_gemma3_parity(tmp_path, linear_path):
    hf = _gemma3()
    m = ax.load_model(_save(hf, tmp_path, "gemma3"), device="cpu")
    assert m.info.family == "gemma3_text"
    assert _local_layers(hf) == [0, 1, 3, 4]  # sliding_window_pattern 3: two local layers, then a global one
    assert m.info.layer_kinds == ("local, window 5", "local, window 5", "global") * 2
    ids = torch.randint(0, 99, (2, N_TOKENS))
    _check(hf, m, ids)
    # the local layers' RoPE base and the global layers' linear scaling both matter
    cfg = json.loads((tmp_path / "gemma3" / "config.json").read_text())
    assert cfg["rope_parameters"]["sliding_attention"]["rope_theta"] == 50.0
    c = m.module.cfg
    assert (c.rope_theta, c.rope_local_theta, c.rope_linear_factor, c.qk_norm) == (10000.0, 50.0, 2.0, True)


def test_gemma3_greedy_generation_with_the_cache_equals_transformers(tmp_path):
    """Prompt and answer longer than the window: each cached step's local layers drop the oldest key."""
    tok = train_tokenizer()
    hf = _gemma3(vocab=tok.get_vocab_size(), max_position_embeddings=128, bos_token_id=None, eos_token_id=None,
                 pad_token_id=None)
    folder = _save(hf, tmp_path, "gemma3")
    tok.save(str(folder / "tokenizer.json"))
    m = ax.load_model(folder, device="cpu")
    assert m.tokenizer.byte_level  # read from the tokenizer's pre-tokenizer: 'Ġ' is shown as a space
    g = m.generate("The capital of France is Paris. Attention", max_new_tokens=16)
    ours = [s.token_id for s in g]
    assert len(g.prompt_ids) > WINDOW
    with torch.no_grad():
        out = hf.generate(torch.tensor([g.prompt_ids]), max_new_tokens=16, do_sample=False)
    theirs = out[0, len(g.prompt_ids):].tolist()
    assert len(ours) >= 4 and ours == theirs[: len(ours)]


def _translate(cfg):
    return translate_config(ARCHITECTURES[cfg["model_type"]], cfg, "config.json")


BASE = dict(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=6, num_attention_heads=4)


def test_older_gemma3_config_fields_are_read():
    """Configs written before transformers 5: rope_theta, rope_local_base_freq, rope_scaling and
    sliding_window_pattern instead of rope_parameters and layer_types."""
    c = _translate(dict(BASE, model_type="gemma3_text", rope_theta=1e6, rope_local_base_freq=1e4,
                        rope_scaling={"rope_type": "linear", "factor": 8.0}, sliding_window=512,
                        sliding_window_pattern=6))
    assert (c.rope_theta, c.rope_local_theta, c.rope_linear_factor) == (1e6, 1e4, 8.0)
    assert c.sliding_windows == [512] * 5 + [None] and c.attn_scale == 256 ** -0.5 and c.head_dim == 256
    # the multimodal config's language model
    mm = _translate(dict(model_type="gemma3", text_config=dict(BASE, sliding_window=8), vision_config={}))
    assert mm.sliding_windows == [8] * 5 + [None]


@pytest.mark.parametrize("change,message", [
    (dict(use_bidirectional_attention=True), "bidirectional"),
    (dict(layer_types=["chunked_attention"] * 6), "chunked_attention"),
    (dict(layer_types=["full_attention"] * 2), "one kind per layer"),
    (dict(rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 1e4}}), "yarn"),
    (dict(hidden_activation="swish"), "swish"),
])
def test_unsupported_gemma_configs_are_one_line(change, message):
    with pytest.raises(UserError, match=message):
        _translate(dict(BASE, model_type="gemma3_text", **change))


def test_gemma3_multimodal_checkpoint_loads_its_language_model(tmp_path):
    """A Gemma3ForConditionalGeneration folder (a vision-language model: tests/hub/test_parity_vlm_gemma3_onevision)
    run on ids alone: its language model, as transformers' own."""
    text = _gemma3(layers=3).config.to_dict()
    vision = dict(hidden_size=16, intermediate_size=20, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    cfg = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                    image_token_index=98, boi_token_index=96, eoi_token_index=97)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = _spread(transformers.Gemma3ForConditionalGeneration(cfg).eval())
    m = ax.load_model(_save(hf, tmp_path, "gemma3mm"), device="cpu")
    ids = torch.randint(0, 90, (1, N_TOKENS))
    with torch.no_grad():
        ref = hf.model.language_model(input_ids=ids, output_attentions=True)
        ref_logits = hf(input_ids=ids).logits
    ours = _run_ours(m, input_ids=ids)
    _compare(ref, ours, 3)
    with torch.inference_mode():
        torch.testing.assert_close(m.module.logits(ours.hidden), ref_logits, atol=TOL, rtol=0)
