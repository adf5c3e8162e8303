"""Vision-language models (core.vlm) against transformers eager: LLaVA 1.5 (CLIP tower read at its last-but-one
layer, class token dropped, 2-layer MLP projector, Llama decoder; and a Qwen2 decoder with the "full" strategy)
and PaliGemma (SigLIP tower, linear projector, Gemma decoder with the prompt open both ways). Tiny configs with
random weights, built here; images made here. Our prompt expansion is checked against the documented one
(the processor's string, tokenized by transformers' own tokenizer wrapping ours), then transformers reads the
very ids and pixels we built: every decoder and tower map, the hidden state, greedy tokens."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub.tiny_vlm import (assert_image_positions, assert_maps_match, cached_builder,  # noqa: E402
                                 eager_perturbed, save_folder)
from tests.tiny_llama import train_tokenizer  # noqa: E402

TOL = 1e-5
IMAGE_ID = 300  # "<image>", added to the 300-token tokenizer

TEXT = dict(vocab_size=304, hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=6,
            num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
CLIP = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            num_attention_heads=4, image_size=32, patch_size=8, projection_dim=16)
SIGLIP = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, image_size=32, patch_size=8)

CASES = {
    "llava": ("LlavaConfig", "LlavaForConditionalGeneration",
              dict(vision_config=CLIP, text_config=dict(TEXT, model_type="llama"), image_token_index=IMAGE_ID,
                   vision_feature_layer=-2, vision_feature_select_strategy="default", tie_word_embeddings=False)),
    "llava-qwen2-full": ("LlavaConfig", "LlavaForConditionalGeneration",
                         dict(vision_config=dict(CLIP, hidden_act="gelu"), image_token_index=IMAGE_ID,
                              text_config=dict(TEXT, model_type="qwen2"), vision_feature_layer=-1,
                              vision_feature_select_strategy="full", tie_word_embeddings=False)),
    # SigLIP-like tower, 2 × 2 pixel shuffle (4 image tokens a view), a 2 × 2 grid of tiles plus the global view
    "idefics3": ("Idefics3Config", "Idefics3ForConditionalGeneration",
                 dict(vision_config=dict(SIGLIP, model_type="idefics3_vision"), text_config=dict(TEXT, model_type="llama"),
                      scale_factor=2, image_token_id=IMAGE_ID, tie_word_embeddings=False)),
    "smolvlm": ("SmolVLMConfig", "SmolVLMForConditionalGeneration",
                dict(vision_config=dict(SIGLIP, model_type="smolvlm_vision"), text_config=dict(TEXT, model_type="llama"),
                     scale_factor=2, image_token_id=IMAGE_ID, tie_word_embeddings=False)),
    "paligemma": ("PaliGemmaConfig", "PaliGemmaForConditionalGeneration",
                  dict(vision_config=SIGLIP, image_token_index=IMAGE_ID, projection_dim=48, vocab_size=304,
                       text_config=dict(TEXT, model_type="gemma", head_dim=8, num_key_value_heads=1))),
}
PROMPTS = {"llava": "USER: <image>\nthe cat sat ASSISTANT:", "llava-qwen2-full": "the cat", "paligemma": "caption the cat",
           "idefics3": "User:<image>the cat sat<end_of_utterance>\nAssistant:", "smolvlm": "<image>Can you describe"}
# image tokens, and the labels of the last two
IMAGE_TOKENS = {"llava": (16, ["<image r3c2>", "<image r3c3>"]), "llava-qwen2-full": (17, ["<image r3c2>", "<image r3c3>"]),
                "paligemma": (16, ["<image r3c2>", "<image r3c3>"]),
                "idefics3": (20, ["<image global r1c0>", "<image global r1c1>"])}
IMAGE_TOKENS["smolvlm"] = IMAGE_TOKENS["idefics3"]


def tokenizer():
    from tokenizers import AddedToken

    tok = train_tokenizer()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<image>", "<fake_token_around_image>", "<global-img>")])
    assert tok.token_to_id("<image>") == IMAGE_ID
    return tok


def make(folder, name):
    cfg_cls, model_cls, kw = CASES[name]
    torch.manual_seed(sorted(CASES).index(name))
    hf = eager_perturbed(getattr(transformers, model_cls), getattr(transformers, cfg_cls)(**kw))
    pre = None
    if name in ("idefics3", "smolvlm"):  # tiles of 32 px from a picture whose longer side is made 64 px: 2 × 2 tiles
        pre = {"size": {"longest_edge": 64}, "do_image_splitting": True, "resample": 1, "image_mean": [0.5] * 3,
               "image_std": [0.5] * 3}
    save_folder(hf, folder, tokenizer(), pre)
    return hf


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return cached_builder(tmp_path_factory, make)


def picture(seed=3):
    return np.random.default_rng(seed).integers(0, 256, (40, 52, 3), dtype=np.uint8)


def expected_text(name, prompt, n):
    """The processors' documented expansion (LlavaProcessor, PaliGemmaProcessor)."""
    if name == "paligemma":
        return "<image>" * n + "<s>" + prompt + "\n"
    if name in ("idefics3", "smolvlm"):  # Idefics3Processor, SmolVLMProcessor: 2 × 2 tiles, 4 tokens each, then the global view
        fake, view = "<fake_token_around_image>", "<image>" * 4
        tiles = "".join("".join(f"{fake}<row_{r}_col_{c}>{view}" for c in (1, 2)) + "\n" for r in (1, 2))
        return prompt.replace("<image>", tiles + f"\n{fake}<global-img>{view}{fake}")
    return prompt.replace("<image>", "<image>" * n) if "<image>" in prompt else "<image>" * n + "\n" + prompt


@pytest.mark.parametrize("name", list(CASES))
def test_vlm_parity_with_transformers(built, name):
    hf, folder = built(name)
    m = ax.load_model(str(folder), device="cpu")
    assert m.info.modality == "image-text" and m.info.family == name.split("-")[0]
    prompt = PROMPTS[name]
    prep = m.prepare(picture(), text=prompt)
    ids, pixels = prep.inputs["input_ids"], prep.inputs["pixels"]
    n = (ids == IMAGE_ID).sum().item()
    assert n == IMAGE_TOKENS[name][0]  # a 4 × 4 patch grid (+ the class token under "full"; Idefics3: 5 views of 2 × 2)
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer())
    bos = hf_tok.convert_ids_to_tokens(TEXT["bos_token_id"])  # PaliGemma's processor writes the BOS itself
    want = hf_tok(expected_text(name, prompt, n).replace("<s>", bos), add_special_tokens=False)
    assert ids[0].tolist() == want["input_ids"]

    r = m.run(picture(), text=prompt, hidden=True)
    extra = {"token_type_ids": torch.zeros_like(ids)} if name == "paligemma" else {}
    hf_pixels = pixels[None] if name in ("idefics3", "smolvlm") else pixels  # Idefics3: (batch, views, C, H, W)
    with torch.no_grad():
        ref = hf.model(input_ids=ids, pixel_values=hf_pixels, output_attentions=True, **extra)
        tower = getattr(hf.model, "vision_tower", None) or hf.model.vision_model
        tower = tower(pixel_values=pixels, output_attentions=True)
    assert_maps_match(name, r, ref, tower, TOL)
    pos = assert_image_positions(r, ids, n, IMAGE_ID, IMAGE_TOKENS[name][1])
    if name.endswith("full"):  # the tower's class token is an image token with no place in the grid
        assert r.tokens[pos[0, 0]] == "<image cls>" and pos[0, 2:4].tolist() == [-1, -1]
    if name in ("idefics3", "smolvlm"):
        assert r.image_tiles == (2, 2) and r.vision_attentions.shape[0] == 5 and pos[:, 1].tolist() == sum(
            ([t] * 4 for t in range(5)), []) and (pos[:, 4] == 2).all()
    if name == "paligemma":  # the whole prompt sees itself both ways: an image token reads the last text token
        assert r.attentions[:, :, 0, -1].min() > 0

    g = m.generate(picture(), text=prompt, max_new_tokens=6)
    with torch.no_grad():
        want_ids = hf.generate(input_ids=ids, pixel_values=hf_pixels, max_new_tokens=6, do_sample=False, **extra)
    assert g.ids == want_ids[0, ids.shape[1]:].tolist()


def test_vlm_bad_inputs(built):
    _, folder = built("llava")
    m = ax.load_model(str(folder), device="cpu")
    with pytest.raises(UserError, match="give it an image"):
        m.run(None, text="hi")
    with pytest.raises(UserError, match="llava is a vision-language model: give it an image"):
        m.run("what is on the mat?")  # a prompt alone, as a text model's run takes it
    with pytest.raises(UserError, match="2 <image> placeholders for 1 image"):
        m.run(picture(), text="<image> and <image>")


def test_vlm_refuses_unsupported_fields(built, tmp_path):
    _, folder = built("llava")
    cfg = json.loads((folder / "config.json").read_text())
    for key, value, words in (("vision_feature_layer", [-2, -1], "list of vision_feature_layer"),
                              ("vision_feature_layer", -9, "vision_feature_layer must be a whole number from -4"),
                              ("vision_feature_select_strategy", "cls", "vision_feature_select_strategy"),
                              ("text_config", dict(cfg["text_config"], model_type="gemma2"),
                               "llava: text_config.model_type 'gemma2' is not supported yet"),
                              ("vision_config", dict(cfg["vision_config"], model_type="dinov2"),
                               "llava: vision_config.model_type 'dinov2' is not supported"),
                              ("image_token_index", 7, "the tokenizer has no <image> token with id 7")):
        bad = dict(cfg, **{key: value})
        (tmp_path / "config.json").write_text(json.dumps(bad))
        for f in folder.iterdir():
            if f.name != "config.json" and not (tmp_path / f.name).exists():
                (tmp_path / f.name).symlink_to(f)
        with pytest.raises(UserError, match=words):
            ax.load_model(str(tmp_path), device="cpu").run(picture(), text="hi")


def test_vlm_export_cli(built, tmp_path, capsys):
    from PIL import Image

    from attn_explorer.cli.main import main

    hf, folder = built("llava")
    img = tmp_path / "pic.png"
    Image.fromarray(picture()).save(img)
    out = tmp_path / "run.npz"
    assert main(["export", "--model", str(folder), "--image", str(img), "--text", PROMPTS["llava"], "--device", "cpu",
                 "--out", str(out)]) == 0
    with np.load(out) as z:
        att, vision, pos = z["attentions"], z["vision_attentions"], z["image_token_positions"]
        assert list(z["image_token_columns"]) == ["token", "tile", "row", "col", "merge"]
    r = ax.load_model(str(folder), device="cpu").run(str(img), text=PROMPTS["llava"])
    assert np.array_equal(att, r.attentions) and np.array_equal(vision, r.vision_attentions)
    assert np.array_equal(pos, r.image_token_positions) and pos.shape == (16, 5)
    assert vision.shape == (1, 3, 4, 16 + 1, 16 + 1)  # one picture, 3 tower layers, 4 heads, [CLS] + 16 patches
    capsys.readouterr()
    for argv, words in (
        (["--model", str(folder), "--text", "hi"], "vision-language model: give it --image"),
        (["--model", str(folder), "--image", str(img), "--text", "<image><image>"], "2 <image> placeholders"),
        (["--model", "textbook", "--image", str(img), "--text", "hi"], "text model: it reads no image"),
    ):
        assert main(["export", *argv, "--device", "cpu", "--out", str(tmp_path / "bad.npz")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err


def test_vlm_hooks_ablation_and_refusals(built):
    """Part C: the decoder's hook points, run_with_cache, ablation, lazy maps equal to the dense ones (PaliGemma's
    two-way prompt mask too); prefix reuse and the analyses built on trace other than relevance and interventions
    (tests/api/test_vlm_analyses.py) refuse in one line naming the family."""
    from attn_explorer.analysis import lens

    _, folder = built("paligemma")
    m = ax.load_model(str(folder), device="cpu")
    names = m.hook_names()
    assert "blocks.2.attn.hook_pattern" in names and "hook_logits" in names
    r, cache = m.run_with_cache(picture(), text="cat", names=["blocks.1.attn.hook_pattern", "blocks.0.hook_resid_post"])
    assert np.allclose(cache["blocks.1.attn.hook_pattern"][0].numpy(), r.attentions[1], atol=1e-7)
    off = m.run(picture(), text="cat", ablate={(0, 1): "zero"}, hidden=True)
    assert np.array_equal(off.attentions[0], r.attentions[0])  # layer 0's maps come before its W_O
    assert np.abs(off.attentions[1] - r.attentions[1]).max() > 1e-4
    with pytest.raises(UserError, match="paligemma: reuse_prefix is not supported yet"):
        m.run(picture(), text="cat", reuse_prefix=True)
    # lazy: the decoder's q, k and row statistics instead of its maps, the prompt's two-way mask kept with them
    from attn_explorer.api.vlm import image_overlay

    lazy = m.run(picture(), text="cat", lazy=True)
    assert lazy.is_lazy and np.array_equal(lazy.vision_attentions, r.vision_attentions)
    L, H = r.attentions.shape[:2]
    worst = max(np.abs(lazy.attention(i, h) - r.attentions[i, h]).max() for i in range(L) for h in range(H))
    assert worst <= 1e-6, worst
    assert np.allclose(image_overlay(lazy, -1).picture, image_overlay(r, -1).picture, atol=1e-6)
    with pytest.raises(UserError, match="lazy"):
        m.run_with_cache(picture(), text="cat", names=["blocks.1.attn.hook_pattern"], lazy=True)
    with pytest.raises(UserError, match="paligemma: this analysis"):
        lens.logit_lens(m, picture())


# Part D: config.json as the hub's checkpoints ship it (llava-hf/llava-1.5-7b-hf, google/paligemma-3b-pt-224):
# the sizes text_config leaves out are transformers' defaults
LLAVA_15 = {"architectures": ["LlavaForConditionalGeneration"], "ignore_index": -100, "image_token_index": 32000,
            "model_type": "llava", "pad_token_id": 32001, "projector_hidden_act": "gelu",
            "text_config": {"_name_or_path": "lmsys/vicuna-7b-v1.5", "architectures": ["LlamaForCausalLM"],
                            "max_position_embeddings": 4096, "model_type": "llama", "rms_norm_eps": 1e-05,
                            "torch_dtype": "float16", "vocab_size": 32064},
            "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.36.0.dev0",
            "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
                              "model_type": "clip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 24,
                              "patch_size": 14, "projection_dim": 768, "vocab_size": 32000},
            "vision_feature_layer": -2, "vision_feature_select_strategy": "default", "vocab_size": 32064}
PALIGEMMA_3B = {"architectures": ["PaliGemmaForConditionalGeneration"], "bos_token_id": 2, "eos_token_id": 1,
                "hidden_size": 2048, "ignore_index": -100, "image_token_index": 257152, "model_type": "paligemma",
                "pad_token_id": 0, "projection_dim": 2048,
                "text_config": {"hidden_size": 2048, "intermediate_size": 16384, "model_type": "gemma",
                                "num_attention_heads": 8, "num_hidden_layers": 18, "num_image_tokens": 256,
                                "num_key_value_heads": 1, "torch_dtype": "float32", "vocab_size": 257216},
                "torch_dtype": "float32", "transformers_version": "4.41.0.dev0",
                "vision_config": {"hidden_size": 1152, "intermediate_size": 4304, "model_type": "siglip_vision_model",
                                  "num_attention_heads": 16, "num_hidden_layers": 27, "num_image_tokens": 256,
                                  "patch_size": 14, "projection_dim": 2048, "projector_hidden_act": "gelu_fast",
                                  "vision_use_head": False},
                "vocab_size": 257216}


@pytest.mark.parametrize("real", ["llava-1.5-7b", "paligemma-3b"])
def test_vlm_real_config_json(real):
    real_config_checked(real)


def real_config_checked(real) -> dict:
    """The real config.json read as transformers reads it (sizes, image tokens, feature layer), then a shrunk copy
    with the same keys (sizes made tiny), a tiny state dict in the checkpoint's own key layout, loaded and run."""
    from attn_explorer.hub.convert import architecture_for, translate_config

    raw = LLAVA_15 if real.startswith("llava") else PALIGEMMA_3B
    cfg = translate_config(architecture_for(raw, real), raw, real)
    hf_cfg = getattr(transformers, "LlavaConfig" if real.startswith("llava") else "PaliGemmaConfig")(**raw)
    t, v = hf_cfg.text_config, hf_cfg.vision_config
    assert (cfg.text.dim, cfg.text.num_layers, cfg.text.num_heads, cfg.text.num_kv_heads, cfg.text.mlp_hidden,
            cfg.text.vocab_size, cfg.text.eps) == (t.hidden_size, t.num_hidden_layers, t.num_attention_heads,
                                                   t.num_key_value_heads, t.intermediate_size, t.vocab_size,
                                                   t.rms_norm_eps)
    assert (cfg.vision.dim, cfg.vision.num_layers, cfg.vision.image_size, cfg.vision.patch_size) == (
        v.hidden_size, v.num_hidden_layers, v.image_size, v.patch_size)
    assert cfg.image_tokens == (576 if real.startswith("llava") else 256)
    assert cfg.feature_depth == (23 if real.startswith("llava") else 27) and cfg.image_token_id == hf_cfg.image_token_id
    assert cfg.text_bos == (1 if real.startswith("llava") else 2) or real.startswith("llava")
    # shrunk: the same keys, tiny sizes (text_config gains the size keys it left to the defaults), float16 tensors
    # under the checkpoint's own names (vision_tower.vision_model.*, language_model.model.*)
    tiny = json.loads(json.dumps(raw))
    tiny["text_config"].update(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
                               num_key_value_heads=2, vocab_size=304, max_position_embeddings=256, head_dim=8)
    tiny["vision_config"].update(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                 image_size=32, patch_size=8)
    tiny.update(vocab_size=304, image_token_index=IMAGE_ID, **({"projection_dim": 48, "hidden_size": 48}
                                                              if "projection_dim" in tiny else {}))
    return tiny


def legacy_name(key: str) -> str:
    for ours, theirs in (("model.vision_tower.", "vision_tower.vision_model."), ("model.language_model.",
                         "language_model.model."), ("model.multi_modal_projector.", "multi_modal_projector."),
                         ("lm_head.", "language_model.lm_head.")):
        if key.startswith(ours):
            return theirs + key[len(ours):]
    return key


@pytest.mark.parametrize("real", ["llava-1.5-7b", "paligemma-3b"])
def test_vlm_real_config_shrunk_loads(real, tmp_path):
    from safetensors.torch import save_file

    tiny = real_config_checked(real)
    is_llava = real.startswith("llava")
    torch.manual_seed(5)
    hf = getattr(transformers, "LlavaForConditionalGeneration" if is_llava else "PaliGemmaForConditionalGeneration")(
        getattr(transformers, "LlavaConfig" if is_llava else "PaliGemmaConfig")(**tiny)).float().eval()
    hf.set_attn_implementation("eager")  # .float(): text_config's torch_dtype float16 builds that part in float16
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_((p + torch.randn_like(p) * 0.1).half().float())  # what float16 tensors hold
    sd = {legacy_name(k): v.half().contiguous() for k, v in hf.state_dict().items()
          if not (k == "lm_head.weight" and not is_llava)}  # PaliGemma ties its head: the checkpoint has none
    save_file(sd, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(tiny))
    tokenizer().save(str(tmp_path / "tokenizer.json"))
    m = ax.load_model(str(tmp_path), device="cpu")
    prep = m.prepare(picture(), text="the cat")
    ids, pixels = prep.inputs["input_ids"], prep.inputs["pixels"]
    r = m.run(picture(), text="the cat", hidden=True)
    extra = {} if is_llava else {"token_type_ids": torch.zeros_like(ids)}
    with torch.no_grad():
        ref = hf.model(input_ids=ids, pixel_values=pixels, output_attentions=True, **extra)
    dec = max(np.abs(r.attentions[i] - a[0].numpy()).max() for i, a in enumerate(ref.attentions))
    hid = np.abs(r.hidden - ref.last_hidden_state[0].numpy()).max()
    print(f"{real} (shrunk, float16 tensors): decoder maps {dec:.2e} hidden {hid:.2e}")
    assert dec <= TOL and hid <= TOL


@pytest.mark.parametrize("name", ["llava-qwen2-full", "idefics3"])
def test_image_overlay(built, name):
    """One text token's attention put back on the picture: tiles assembled, merges undone, the class token apart."""
    from attn_explorer.api.vlm import image_overlay

    _, folder = built(name)
    r = ax.load_model(str(folder), device="cpu").run(picture(), text=PROMPTS[name])
    pos = r.image_token_positions
    o = image_overlay(r, -1, layer=1, head=2)
    row = r.attentions[1, 2, -1]
    if name == "idefics3":  # 2 × 2 tiles of 2 × 2 tokens, each token 2 × 2 patches: an 8 × 8 picture, a 4 × 4 global view
        assert o.views.shape == (5, 4, 4) and o.picture.shape == (8, 8) and o.global_view.shape == (4, 4)
        t1 = pos[(pos[:, 1] == 1) & (pos[:, 2] == 1) & (pos[:, 3] == 0), 0][0]  # tile 1 (top right), token row 1, col 0
        assert o.picture[2:4, 4:6].tolist() == [[row[t1]] * 2] * 2 and o.cls == 0
        assert np.isclose(o.picture.sum() / 4 + o.global_view.sum() / 4, row[pos[:, 0]].sum())
    else:
        assert o.views.shape == (1, 4, 4) and o.global_view is None and np.isclose(o.cls, row[pos[0, 0]])
        assert np.allclose(o.picture.ravel(), row[pos[1:, 0]])
    mean = image_overlay(r, -1)  # every layer and head
    L, H = r.attentions.shape[:2]
    each = [image_overlay(r, -1, layer=i, head=h) for i in range(L) for h in range(H)]
    assert np.allclose(mean.views, np.mean([e.views for e in each], axis=0), atol=1e-7)
    assert np.isclose(mean.cls, np.mean([e.cls for e in each]))


def test_vlm_tower_maps_too_large_are_left_out(built, monkeypatch):
    """The tower's maps (views × layers × heads × tokens², SmolVLM's 13 tiles of 1,024 patches: 7.8 GB) are left
    out with a note past DENSE_MAX_BYTES; the decoder's maps and the image tokens stay."""
    import attn_explorer.api.vlm as vlm

    _, folder = built("idefics3")
    m = ax.load_model(str(folder), device="cpu")
    full = m.run(picture(), text=PROMPTS["idefics3"])
    assert m.vision_maps_bytes(m.prepare(picture(), text="x")) == full.vision_attentions.nbytes
    monkeypatch.setattr(vlm, "DENSE_MAX_BYTES", full.vision_attentions.nbytes - 1)
    r = m.run(picture(), text=PROMPTS["idefics3"])
    assert r.vision_attentions is None and any("tower's maps" in n for n in r.notes)
    assert np.allclose(r.attentions, full.attentions, atol=1e-6)  # the tower ran its fused path: rounding apart
