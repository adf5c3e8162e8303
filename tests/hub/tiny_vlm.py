"""Shared steps of the vision-language parity tests' tiny random checkpoints: transformers' own model built with eager
attention and every weight moved off its init (N(0, 0.1) added, drawn from torch's global generator: seed first),
saved as a folder ax.load_model reads (safetensors, tokenizer.json, preprocessor_config.json); a module-scoped cache
of such folders by case name."""
from __future__ import annotations

import json

import torch


def eager_perturbed(model_cls, cfg):
    """model_cls(cfg) in eval mode with eager attention, every parameter plus N(0, 0.1) noise."""
    cfg._attn_implementation = "eager"
    hf = model_cls(cfg).eval()
    hf.set_attn_implementation("eager")
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return hf


def save_folder(hf, folder, tok, preprocessor: dict | None = None):
    """hf's weights (safetensors), tok as tokenizer.json and, when given, preprocessor as preprocessor_config.json."""
    hf.save_pretrained(folder, safe_serialization=True)
    tok.save(str(folder / "tokenizer.json"))
    if preprocessor is not None:
        (folder / "preprocessor_config.json").write_text(json.dumps(preprocessor))


def cached_builder(tmp_path_factory, make):
    """get(name) -> (model, folder): make(folder, name) once per name, in a fresh temporary folder."""
    cache = {}

    def get(name):
        if name not in cache:
            folder = tmp_path_factory.mktemp(name)
            cache[name] = (make(folder, name), folder)
        return cache[name]

    return get


def assert_maps_match(name, r, ref, tower, tol):
    """Our run r against transformers' language model output ref and vision tower output tower: every decoder
    map, every tower map and the last hidden state within tol (printed), and as many layers on both sides."""
    import numpy as np

    dec = max(np.abs(r.attentions[i] - a[0].numpy()).max() for i, a in enumerate(ref.attentions))
    vis = max(np.abs(r.vision_attentions[:, i] - a.numpy()).max() for i, a in enumerate(tower.attentions))
    hid = np.abs(r.hidden - ref.last_hidden_state[0].numpy()).max()
    print(f"{name}: decoder maps {dec:.2e} tower maps {vis:.2e} hidden {hid:.2e}")
    assert len(ref.attentions) == r.attentions.shape[0] and len(tower.attentions) == r.vision_attentions.shape[1]
    assert dec <= tol and vis <= tol and hid <= tol


def assert_image_positions(r, ids, n, image_id, last_two):
    """r's image token positions: n rows of 5, each on an image_id token, the last two labelled last_two;
    returns them."""
    pos = r.image_token_positions
    assert pos.shape == (n, 5) and (ids[0, pos[:, 0]] == image_id).all()
    assert [r.tokens[i] for i in pos[-2:, 0]] == last_two
    return pos
