"""RoPE scaling as transformers computes it: every rope type of transformers' ROPE_INIT_FUNCTIONS
(linear, dynamic NTK, YaRN, LongRoPE, Llama 3, proportional) on tiny seeded Llamas saved by
transformers, read from config.json in both forms (transformers 5's rope_parameters, and the older
rope_scaling + rope_theta), compared with transformers eager on a sequence longer than the original
positions: attention maps and the last hidden state within 1e-5 in float32. Qwen2 with YaRN, Phi-3
with LongRoPE (below and above its original length) and Gemma 3 with scaled global layers too."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402

TOL = 1e-5
VOCAB = 300
ORIGINAL = 32  # original_max_position_embeddings: the length the scaling stretches
LONG, SHORT = 48, 20  # a sequence past the original positions, and one within them

# head_dim 16: eight frequencies, so Llama 3's high, medium and low bands and YaRN's ramp all occur
COMMON = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=3,
              num_key_value_heads=1, max_position_embeddings=128, attn_implementation="eager", bos_token_id=1,
              eos_token_id=2, pad_token_id=0, initializer_range=0.2)

# name -> (rope_parameters, config overrides)
LLAMA = {
    "default": (dict(rope_type="default"), {}),
    "linear": (dict(rope_type="linear", factor=2.5), {}),
    # NTK's base grows with the current length past max_position_embeddings (32 here, not 128)
    "dynamic": (dict(rope_type="dynamic", factor=2.0), dict(max_position_embeddings=ORIGINAL)),
    "yarn": (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=ORIGINAL), {}),
    "yarn-mscale": (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=ORIGINAL, beta_fast=16.0,
                         beta_slow=2.0, mscale=0.8, mscale_all_dim=0.5, truncate=False), {}),
    "yarn-attention-factor": (dict(rope_type="yarn", factor=3.0, original_max_position_embeddings=ORIGINAL,
                                   attention_factor=1.25), {}),
    # no factor: max_position_embeddings / original (4); its attention factor follows from that
    "longrope": (dict(rope_type="longrope", original_max_position_embeddings=ORIGINAL,
                      short_factor=[1.0, 1.1, 1.3, 1.7, 2.0, 2.5, 3.0, 3.5],
                      long_factor=[1.0, 1.5, 2.0, 3.0, 4.5, 6.0, 8.0, 9.0]), {}),
    "llama3": (dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=ORIGINAL), {}),
    # half of each head's frequencies turn, the others are 0 (the whole head is "rotated")
    "proportional": (dict(rope_type="proportional", partial_rotary_factor=0.5, factor=2.0), {}),
}


def _randomise(hf):
    with torch.no_grad():
        for p in hf.parameters():  # norm weights too: every weight off its init
            p.add_(torch.randn_like(p) * 0.1)
    return hf.eval()


def _save(hf, folder, legacy: bool):
    """save_pretrained writes rope_parameters only; legacy=True rewrites config.json the way
    configs were written before transformers 5: rope_theta on top, the rest as rope_scaling."""
    hf.save_pretrained(folder, safe_serialization=True)
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    assert "rope_scaling" not in cfg and "rope_parameters" in cfg
    if legacy:
        params = dict(cfg.pop("rope_parameters"))
        cfg["rope_theta"] = params.pop("rope_theta")
        if "partial_rotary_factor" in params:
            cfg["partial_rotary_factor"] = params.pop("partial_rotary_factor")
        if params.get("rope_type", "default") != "default":
            cfg["rope_scaling"] = params
        path.write_text(json.dumps(cfg))
    return folder


def _llama(name: str, theta: float = 10000.0):
    params, overrides = LLAMA[name]
    torch.manual_seed(sorted(LLAMA).index(name))
    cfg = transformers.LlamaConfig(**{**COMMON, **overrides, "rope_parameters": dict(params, rope_theta=theta)})
    return _randomise(transformers.LlamaModel(cfg))


def max_differences(hf, m, ids):
    """(max |ours - transformers| over every layer's attention map, over the last hidden state)."""
    with torch.no_grad():
        ref = hf(input_ids=ids, output_attentions=True)
    with torch.inference_mode():
        ours = m.module(input_ids=ids, output_attentions=True)
    att = max((ours.attentions[:, i] - a).abs().max().item() for i, a in enumerate(ref.attentions))
    return att, (ours.hidden - ref.last_hidden_state).abs().max().item()


def _ids(n: int, seed: int = 7):
    return torch.randint(3, VOCAB, (2, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def llamas(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = _llama(name)
        return cache[name]
    return get


@pytest.mark.parametrize("legacy", [False, True], ids=["rope_parameters", "rope_scaling"])
@pytest.mark.parametrize("name", list(LLAMA))
def test_llama_rope_scaling_matches_transformers(llamas, tmp_path, name, legacy):
    hf = llamas(name)
    m = ax.load_model(str(_save(hf, tmp_path, legacy)), device="cpu")
    for n in (LONG, SHORT):  # past the original positions (where the scalings differ), and within them
        att, hidden = max_differences(hf, m, _ids(n))
        assert att <= TOL and hidden <= TOL, (name, n, att, hidden)


def test_the_llama3_scaling_is_not_ignored(llamas, tmp_path):
    """The issue's symptom: a Llama 3 config loaded as plain RoPE parts from transformers by ~3e-3.
    The scaled model and the plain one really do differ here, so the parity above can see it."""
    hf = llamas("llama3")
    m = ax.load_model(str(_save(hf, tmp_path, legacy=False)), device="cpu")
    assert m.module.cfg.rope_scaling.kind == "llama3"
    plain = transformers.LlamaModel(transformers.LlamaConfig(**{**COMMON, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0}})).eval()
    plain.load_state_dict(hf.state_dict())
    with torch.no_grad():
        a = hf(input_ids=_ids(LONG), output_attentions=True).attentions[-1]
        b = plain(input_ids=_ids(LONG), output_attentions=True).attentions[-1]
    assert (a - b).abs().max() > 1e-3


def _family(cls: str, model: str, seed: int, **overrides):
    torch.manual_seed(seed)
    return _randomise(getattr(transformers, model)(getattr(transformers, cls)(**{**COMMON, **overrides})))


@pytest.mark.parametrize("legacy", [False, True], ids=["rope_parameters", "rope_scaling"])
def test_qwen2_with_yarn_matches_transformers(tmp_path, legacy):
    """Qwen2.5's long-context recipe: YaRN over the original 32 positions, factor 4."""
    hf = _family("Qwen2Config", "Qwen2Model", 1, rope_parameters=dict(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=ORIGINAL, rope_theta=1000.0))
    m = ax.load_model(str(_save(hf, tmp_path, legacy)), device="cpu")
    assert m.module.cfg.rope_scaling.kind == "yarn" and m.module.cfg.rope_theta == 1000.0
    for n in (LONG, SHORT):
        att, hidden = max_differences(hf, m, _ids(n))
        assert att <= TOL and hidden <= TOL, (n, att, hidden)


SHORT_FACTORS, LONG_FACTORS = [1.0, 1.2, 1.6, 2.1], [1.0, 2.0, 5.0, 9.0]  # per rotated pair: 8 of d_k = 16


@pytest.mark.parametrize("legacy", [False, "longrope", "su"], ids=["rope_parameters", "rope_scaling", "su"])
def test_phi3_with_longrope_matches_transformers_below_and_above_the_original_length(tmp_path, legacy):
    """Phi-3.5 / Phi-4-mini: LongRoPE on part of each head (partial_rotary_factor 0.5), the short
    factors up to original_max_position_embeddings (Phi-3's own top-level field), the long ones past
    it, cos and sin times the attention factor in both. "su" is Phi-3's older name for it."""
    hf = _family("Phi3Config", "Phi3Model", 2, original_max_position_embeddings=ORIGINAL, partial_rotary_factor=0.5,
                 rope_parameters=dict(rope_type="longrope", short_factor=SHORT_FACTORS, long_factor=LONG_FACTORS,
                                      rope_theta=10000.0))
    folder = _save(hf, tmp_path, bool(legacy))
    if legacy == "su":
        cfg = json.loads((folder / "config.json").read_text())
        cfg["rope_scaling"].pop("rope_type")
        cfg["rope_scaling"]["type"] = "su"
        (folder / "config.json").write_text(json.dumps(cfg))
    m = ax.load_model(str(folder), device="cpu")
    s = m.module.cfg.rope_scaling
    assert (s.kind, s.original_positions, m.module.cfg.rotary_dim) == ("longrope", ORIGINAL, 8)
    for n in (SHORT, ORIGINAL, ORIGINAL + 1, LONG):  # the switch lies between 32 and 33 tokens
        att, hidden = max_differences(hf, m, _ids(n))
        assert att <= TOL and hidden <= TOL, (n, att, hidden)


def test_the_tables_switch_with_the_length_and_come_back(llamas, tmp_path):
    """LongRoPE and dynamic NTK frequencies depend on the forward's length: a long forward after a short
    one, and a short one after it, each equal transformers' (our cached table is not reused across)."""
    for name in ("longrope", "dynamic"):
        hf = llamas(name)
        m = ax.load_model(str(_save(hf, tmp_path / name, legacy=False)), device="cpu")
        for n in (SHORT, LONG, SHORT, LONG + 5):
            fresh = _llama(name)  # transformers' dynamic frequencies are stateful: a fresh model per length
            att, hidden = max_differences(fresh, m, _ids(n))
            assert att <= TOL and hidden <= TOL, (name, n, att, hidden)


@pytest.mark.parametrize("change,words", [
    (dict(rope_parameters={"rope_type": "ntk-by-parts", "factor": 2.0, "rope_theta": 10000.0}), "'ntk-by-parts'"),
    (dict(rope_parameters=None, rope_scaling={"type": "mrope", "factor": 2.0}), "'mrope'"),
    (dict(rope_parameters={"rope_type": "llama3", "factor": 4.0, "rope_theta": 10000.0}), "low_freq_factor"),
    (dict(rope_parameters={"rope_type": "linear", "factor": "two", "rope_theta": 10000.0}), "factor"),
    (dict(rope_parameters={"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 8,
                           "rope_theta": 10000.0}), "short_factor must list 8"),
])
def test_an_unknown_or_broken_rope_type_is_refused_in_one_line(llamas, tmp_path, change, words):
    folder = _save(llamas("default"), tmp_path, legacy=False)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(change)
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError) as e:
        ax.load_model(str(folder), device="cpu")
    message = str(e.value)
    assert "\n" not in message and words in message, message
    if "'" in words:  # an unknown type: the message lists the supported ones
        assert all(k in message for k in ("linear", "dynamic", "yarn", "longrope", "llama3"))



def test_the_config_with_its_scaling_survives_json(llamas, tmp_path):
    """Our LlamaConfig as plain JSON (dataclasses.asdict) and back: the same scaling, the same maps."""
    import dataclasses

    from attn_explorer.core.llama import Llama, LlamaConfig

    hf = llamas("longrope")
    m = ax.load_model(str(_save(hf, tmp_path, legacy=False)), device="cpu")
    cfg = LlamaConfig(**json.loads(json.dumps(dataclasses.asdict(m.module.cfg))))
    assert cfg == m.module.cfg and cfg.rope_scaling.long_factor == tuple(LLAMA["longrope"][0]["long_factor"])
    again = Llama(cfg).eval()
    again.load_state_dict(m.module.state_dict())
    with torch.inference_mode():
        a = again(input_ids=_ids(LONG), output_attentions=True).attentions
        b = m.module(input_ids=_ids(LONG), output_attentions=True).attentions
    assert torch.equal(a, b)
