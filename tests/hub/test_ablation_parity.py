"""`Model.run(x, ablate=...)` against transformers with the same heads switched off by hand.

For each family a tiny seeded random transformers model is saved and loaded through the public loader;
transformers gets a forward pre-hook on its W_O (o_proj, attention.output.dense, c_proj, dense, out_proj)
that sets the ablated heads' slice of its input to zero, or to that slice's mean over the positions. Every
layer's attention map (the layers after an ablated one change) and the last hidden state must agree
within 1e-6 (both sides in float64; the RMSNorm families, whose norms compute in float32 on both sides,
within 3x their plain parity, measured at 0.5-1.7e-6), and the ablation must change them (so the test
cannot pass with the hook ignored).
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.core import linear  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub.test_parity import _save, _vision_model  # noqa: E402
from tests.hub.test_parity_gemma import _gemma3  # noqa: E402
from tests.hub.test_parity_more_families import PIECES, _opt_config, byte_level_bpe, wordpiece_vocab  # noqa: E402
from tests.hub.test_parity_rotary_families import make_folder  # noqa: E402
from tests.tiny_llama import make_llama_folder, train_tokenizer  # noqa: E402

TOL = 1e-6
ABLATE = {(0, 1): "zero", (0, 2): "mean", (1, 0): "zero", (1, 2): "mean"}
TEXT = "The capital of France is Paris. Attention lets every token look at the tokens before it."
BERT_TEXT = "the cat sat on the mat . a dog ran , all you need is attention"


@pytest.fixture(autouse=True)
def plain_linear(monkeypatch):
    """F.linear on both sides: the CPU fast path's prepacked products round differently at 1e-7."""
    monkeypatch.setattr(linear, "fast_path_enabled", False)


def _spread(hf, std=0.1):
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * std)
    return hf


def _bert(folder):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(PIECES), hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                                  intermediate_size=37, max_position_embeddings=64, attn_implementation="eager",
                                  initializer_range=0.15)
    hf = transformers.BertModel(cfg).eval()
    _save(hf, folder.parent, folder.name)
    wordpiece_vocab(folder)
    return hf, 12


def _gpt2(folder):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=train_tokenizer().get_vocab_size(), n_embd=48, n_layer=3, n_head=4,
                                  n_positions=64, attn_implementation="eager", initializer_range=0.3)
    hf = transformers.GPT2Model(cfg).eval()
    _save(hf, folder.parent, folder.name)
    byte_level_bpe(folder)
    return hf, 12


def _opt(folder):
    torch.manual_seed(0)
    hf = transformers.OPTModel(_opt_config(train_tokenizer().get_vocab_size(), num_hidden_layers=3,
                                           max_position_embeddings=64)).eval()
    _save(hf, folder.parent, folder.name)
    byte_level_bpe(folder)
    return hf, 8


def _llama(folder):
    make_llama_folder(folder, num_hidden_layers=3)
    hf = transformers.LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    return hf.model, 8


def _rotary(name):
    def build(folder):
        hf = make_folder(folder, name)
        base = hf.gpt_neox if hasattr(hf, "gpt_neox") else hf.model
        return base, 8
    return build


def _gemma(folder):
    hf = _gemma3(layers=3, vocab=train_tokenizer().get_vocab_size())
    hf.save_pretrained(folder, safe_serialization=True)
    byte_level_bpe(folder)
    return hf.model, 16


def _vit(folder):
    torch.manual_seed(0)
    hf = _vision_model("vit", 4, 16, 4).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "token" in name or "position_embeddings" in name:
                p.normal_(std=0.5)
    _spread(hf)
    _save(hf, folder.parent, folder.name)
    return hf, 8


# name -> build(folder): saves the tiny model (and a tokenizer) there, returns (the transformers module whose
# output has `attentions` and `last_hidden_state`, each head's d_v)
FAMILIES = {"bert": _bert, "gpt2": _gpt2, "opt": _opt, "llama": _llama, "qwen2": _rotary("qwen2"),
            "mistral": _rotary("mistral"), "gpt_neox": _rotary("gpt_neox"), "gemma3": _gemma, "vit": _vit}


W_O_NAMES = re.compile(r"(?:^|\.)(?:layers?|h)\.(\d+)\.(?:self_attn|attn|attention)\.(?:o_proj|out_proj|c_proj|dense|"
                       r"output\.dense)$")


def w_o(hf, layer: int) -> torch.nn.Module:
    """transformers' W_O of `layer` (o_proj, out_proj, c_proj, attention.dense, attention.output.dense),
    found by name so that a renamed module tree (ViT's in transformers 5) is found too."""
    hits = [mod for name, mod in hf.named_modules() if (k := W_O_NAMES.search(name)) and int(k.group(1)) == layer]
    assert len(hits) == 1, (layer, len(hits))
    return hits[0]


def _pre_hook(heads: dict[int, str], d: int):
    """W_O's input (B, N, H·d): head h's slice zeroed, or set to its mean over the positions."""
    def hook(_module, args):
        x = args[0].clone()
        for h, how in heads.items():
            part = x[..., h * d:(h + 1) * d]
            x[..., h * d:(h + 1) * d] = 0.0 if how == "zero" else part.mean(dim=1, keepdim=True)
        return (x, *args[1:])
    return hook


def _hf_run(hf, d, inputs, ablate):
    per_layer: dict[int, dict[int, str]] = {}
    for (l, h), how in ablate.items():
        per_layer.setdefault(l, {})[h] = how
    handles = [w_o(hf, l).register_forward_pre_hook(_pre_hook(heads, d)) for l, heads in per_layer.items()]
    try:
        with torch.no_grad():
            return hf(**inputs, output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()


def _max_errors(r, ref) -> tuple[float, float]:
    """(max |ours − transformers| over every layer's map, over the last hidden state)."""
    att = max(float(np.abs(r.attentions[i] - a[0].numpy()).max()) for i, a in enumerate(ref.attentions))
    return att, float(np.abs(r.hidden - ref.last_hidden_state[0].numpy()).max())


def _input(name, m):
    if name == "vit":
        from PIL import Image

        img = Image.fromarray((np.random.default_rng(0).random((16, 16, 3)) * 255).astype(np.uint8))
        return img, {"pixel_values": m.prepare(img).inputs["pixels"].double()}
    text = BERT_TEXT if name == "bert" else TEXT
    inputs = m.prepare(text).inputs
    hf_inputs = {"input_ids": inputs["input_ids"]}
    if "token_type_ids" in inputs:
        hf_inputs["token_type_ids"] = inputs["token_type_ids"]
    return text, hf_inputs


@pytest.mark.parametrize("name", list(FAMILIES))
def test_ablation_equals_transformers_with_w_o_input_zeroed(tmp_path, name):
    folder = tmp_path / name
    folder.mkdir()
    hf, d = FAMILIES[name](folder)
    hf.double()  # both sides in float64: float32 rounding alone is ~1e-6 on these states
    m = ax.load_model(str(folder), device="cpu")
    m.module.double()
    assert m.info.family == json.loads((folder / "config.json").read_text())["model_type"]
    x, hf_inputs = _input(name, m)
    plain = m.run(x, hidden=True)
    ours = m.run(x, ablate=ABLATE, hidden=True)
    ref = _hf_run(hf, d, hf_inputs, ABLATE)
    base = _hf_run(hf, d, hf_inputs, {})
    assert ours.attentions.shape[0] == len(ref.attentions) == len(base.attentions)
    err = _max_errors(ours, ref)
    plain_err = _max_errors(plain, base)
    # within 1e-6; where float32 steps inside both implementations (RMSNorm computes in float32 on both
    # sides, even in float64) leave the plain models ~1e-6 apart already, within 3x that plain distance
    assert err[0] <= max(TOL, 3 * plain_err[0]) and err[1] <= max(TOL, 3 * plain_err[1]), (name, err, plain_err)
    assert np.abs(ours.hidden - plain.hidden).max() > 1e-3  # the heads were switched off
    assert np.abs(ours.attentions[1:] - plain.attentions[1:]).max() > 1e-4  # later layers' maps move
    assert np.array_equal(ours.attentions[0], plain.attentions[0])  # nothing before the first ablated layer moves


def test_bad_ablations_are_one_line(tmp_path):
    folder = make_llama_folder(tmp_path / "llama")
    m = ax.load_model(str(folder), device="cpu")
    for bad, words in (({(2, 0): "zero"}, "no head L2 H0"), ({(0, 6): "zero"}, "no head L0 H6"),
                       ({(0, 0): "half"}, "unknown ablation"), ({0: "zero"}, "(layer, head)")):
        with pytest.raises(UserError) as e:
            m.run("The capital", ablate=bad)
        assert words in str(e.value) and "\n" not in str(e.value)
