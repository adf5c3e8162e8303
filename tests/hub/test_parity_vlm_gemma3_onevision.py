"""Gemma 3 multimodal and LLaVA OneVision (core.vlm, core.vlm_connectors) against transformers eager. Tiny configs
with random weights built here (every weight moved off its init: the (1 + w) norms, the soft-embedding norm and
projection, the newline vector), images made here. Our prompt expansion is checked against the processors'
documented one (tokenized by transformers' tokenizer wrapping ours), our OneVision pixels against transformers' own
image processor; then transformers reads the very ids and pixels we built: every decoder and tower map, the hidden
state, greedy tokens.

- gemma3: a SigLIP tower of 8 × 8 patches pooled 2 × 2 into 16 image tokens, local layers of window 5 beside global
  ones: the image run (16 tokens, longer than the window) attends to itself both ways; on the local layers a token
  still sees only the window behind it (every key of the run ahead of it stays open, as transformers' mask has it).
- llava_onevision: a 40 × 52 picture on a 2 × 2 canvas of 32 px tiles (4 × 4 patches each), the padding rows cut
  (6 × 8 patches kept), a newline after each row; "-shrink" (anyres_max_1) shrinks the canvas bilinearly to 3 × 4.
"""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from tests.hub.test_parity_vlm import SIGLIP, TEXT, TOL, picture, tokenizer  # noqa: E402
from tests.hub.tiny_vlm import (assert_image_positions, assert_maps_match, cached_builder,  # noqa: E402
                                 eager_perturbed, save_folder)

BOI, EOI, SOFT = 303, 304, 305  # <start_of_image>, <end_of_image>, <image_soft_token>
ONE_IMAGE = 300  # <image>
VOCAB = 310
PINPOINTS = [[32, 32], [32, 64], [64, 32], [64, 64], [32, 96], [96, 32]]
GEMMA_TEXT = dict(TEXT, vocab_size=VOCAB, model_type="gemma3_text", head_dim=12, num_attention_heads=4,
                  num_key_value_heads=2, query_pre_attn_scalar=12, sliding_window=5, num_hidden_layers=4,
                  layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"])
ONEVISION = dict(vision_config=dict(SIGLIP, vision_use_head=False), text_config=dict(TEXT, vocab_size=VOCAB,
                 model_type="qwen2"), image_token_index=ONE_IMAGE, image_grid_pinpoints=PINPOINTS,
                 vision_feature_select_strategy="full", vision_feature_layer=-1, tie_word_embeddings=False)
CASES = {
    "gemma3": ("Gemma3Config", "Gemma3ForConditionalGeneration",
               dict(vision_config=dict(SIGLIP, patch_size=4), text_config=GEMMA_TEXT, mm_tokens_per_image=16,
                    image_token_index=SOFT, boi_token_index=BOI, eoi_token_index=EOI)),
    # the image soft token past the decoder's vocabulary (305 ids): embedded as id 0 before the image vectors go in
    "gemma3-oov": ("Gemma3Config", "Gemma3ForConditionalGeneration",
                   dict(vision_config=dict(SIGLIP, patch_size=4), text_config=dict(GEMMA_TEXT, vocab_size=SOFT),
                        mm_tokens_per_image=16, image_token_index=SOFT, boi_token_index=BOI, eoi_token_index=EOI)),
    "llava_onevision": ("LlavaOnevisionConfig", "LlavaOnevisionForConditionalGeneration", ONEVISION),
    "llava_onevision-shrink": ("LlavaOnevisionConfig", "LlavaOnevisionForConditionalGeneration",
                               dict(ONEVISION, vision_aspect_ratio="anyres_max_1")),
}
PROMPTS = {"gemma3": "<start_of_turn>user\n<start_of_image>the cat sat<end_of_turn>\n", "gemma3-oov": "the cat",
           "llava_onevision": "the cat",
           "llava_onevision-shrink": "<image>\nthe cat sat"}
# image tokens, and the labels of the last two
IMAGE_TOKENS = {"gemma3": (16, ["<image r3c2>", "<image r3c3>"]),
                "gemma3-oov": (16, ["<image r3c2>", "<image r3c3>"]),
                "llava_onevision": (16 + 6 * 9, ["<image r5c7>", "<image newline r5>"]),
                "llava_onevision-shrink": (16 + 3 * 5, ["<image r2c3>", "<image newline r2>"])}


def gemma_tokenizer():
    from tokenizers import AddedToken

    tok = tokenizer()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<start_of_image>", "<end_of_image>", "<image_soft_token>")])
    assert tok.token_to_id("<image_soft_token>") == SOFT
    return tok


def preprocessor(name):
    if name.startswith("gemma3"):
        return {"size": {"height": 32, "width": 32}, "resample": 2, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
                "do_pan_and_scan": None}
    return {"size": {"height": 32, "width": 32}, "resample": 3, "image_mean": [0.48, 0.45, 0.4],
            "image_std": [0.26, 0.26, 0.27], "image_grid_pinpoints": PINPOINTS}


def make(folder, name):
    cfg_cls, model_cls, kw = CASES[name]
    torch.manual_seed({"gemma3": 11, "llava_onevision": 12, "llava_onevision-shrink": 13, "gemma3-oov": 14}[name])
    hf = eager_perturbed(getattr(transformers, model_cls), getattr(transformers, cfg_cls)(**kw))
    save_folder(hf, folder, gemma_tokenizer(), preprocessor(name))
    return hf


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return cached_builder(tmp_path_factory, make)


def expected_text(name, prompt, n):
    """The processors' documented expansion (Gemma3Processor, LlavaOnevisionProcessor)."""
    if name.startswith("gemma3"):  # no placeholder: the picture first, where the chat template puts it
        block = "\n\n<start_of_image>" + "<image_soft_token>" * n + "<end_of_image>\n\n"
        return prompt.replace("<start_of_image>", block) if "<start_of_image>" in prompt else block + prompt
    return prompt.replace("<image>", "<image>" * n) if "<image>" in prompt else "<image>" * n + "\n" + prompt


def onevision_processor_count(ratio: str) -> int:
    """LlavaOnevisionProcessor._get_number_of_features for the 40 × 52 picture, 16 tokens a view, on PINPOINTS
    (called on a stand-in for the processor: building one wants a video processor, which wants torchvision)."""
    from types import SimpleNamespace

    cls = transformers.LlavaOnevisionProcessor
    proc = SimpleNamespace(image_processor=SimpleNamespace(image_grid_pinpoints=PINPOINTS), num_image_tokens=16,
                           vision_aspect_ratio=ratio)
    proc._get_unpadded_features = lambda *a: cls._get_unpadded_features(proc, *a)
    return cls._get_number_of_features(proc, 40, 52, 32, 32)


def hf_inputs(name, prep):
    ids, pixels = prep.inputs["input_ids"], prep.inputs["pixels"]
    if name.startswith("gemma3"):  # the processor's token types: 1 at the image soft tokens
        return dict(input_ids=ids, pixel_values=pixels, token_type_ids=(ids == SOFT).long())
    return dict(input_ids=ids, pixel_values=pixels[None], image_sizes=torch.tensor([prep.inputs["image_size"]]))


@pytest.mark.parametrize("name", list(CASES))
def test_parity_with_transformers(built, name):
    hf, folder = built(name)
    m = ax.load_model(str(folder), device="cpu")
    family = name.split("-")[0]
    assert m.info.modality == "image-text" and m.info.family == family
    prompt = PROMPTS[name]
    prep = m.prepare(picture(), text=prompt)
    ids = prep.inputs["input_ids"]
    image_id = SOFT if family == "gemma3" else ONE_IMAGE
    n = (ids == image_id).sum().item()
    assert n == IMAGE_TOKENS[name][0]
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=gemma_tokenizer())
    assert ids[0].tolist() == hf_tok(expected_text(name, prompt, n))["input_ids"]
    if family == "llava_onevision":  # the count LlavaOnevisionProcessor's own arithmetic gives ("full": no -1)
        assert n == onevision_processor_count(CASES[name][2].get("vision_aspect_ratio", "anyres_max_9"))
        # the base view and the tiles as transformers' own image processor cuts them
        pp = transformers.LlavaOnevisionImageProcessorPil(**{k: v for k, v in preprocessor(name).items()})
        want = pp(picture(), return_tensors="pt")
        assert want["image_sizes"].tolist() == [[40, 52]] and prep.inputs["image_size"] == (40, 52)
        assert want["pixel_values"].shape == (1, 5, 3, 32, 32)
        assert torch.allclose(prep.inputs["pixels"], want["pixel_values"][0], atol=1e-6)

    r = m.run(picture(), text=prompt, hidden=True)
    feed = hf_inputs(name, prep)
    with torch.no_grad():
        ref = hf.model(output_attentions=True, **feed)
        tower = hf.model.vision_tower(pixel_values=prep.inputs["pixels"], output_attentions=True)
    assert_maps_match(name, r, ref, tower, TOL)
    pos = assert_image_positions(r, ids, n, image_id, IMAGE_TOKENS[name][1])
    first = int(pos[0, 0])
    if family == "gemma3":  # the image run both ways, inside the window on the local layers
        assert (pos[:, 4] == 2).all() and r.vision_attentions.shape == (1, 2, 4, 64, 64)
        assert r.attentions[1, :, first, first + 15].min() > 0  # global: the first image token reads the last
        assert r.attentions[0, :, first, first + 15].min() > 0  # local too: keys ahead in the run are not cut
        last = first + 15  # but keys behind are cut to the window (5: itself and 4 before)
        assert r.attentions[0, :, last, last - 4].min() > 0 and r.attentions[0, :, last, last - 5].max() == 0
        assert r.attentions[1, :, first + 16, first].min() > 0  # <end_of_image> reads the run causally
        assert r.attentions[1, :, first - 1, first].max() == 0  # <start_of_image> does not see it
        assert m.info.layer_kinds[0] == "local, window 5, image tokens both ways"
    else:
        # the base view's tokens first (tile 1), then the canvas's (tile 0: it lies on the picture)
        assert r.vision_attentions.shape[0] == 5 and (pos[:16, 1] == 1).all() and (pos[16:, 1] == 0).all()
        assert r.attentions[:, :, first, first + 1].max() == 0  # causal
        if "<image>" not in prompt:
            assert any("as LLaVA OneVision's chat template puts it" in note for note in r.notes), r.notes

    g = m.generate(picture(), text=prompt, max_new_tokens=6)
    with torch.no_grad():
        want_ids = hf.generate(max_new_tokens=6, do_sample=False, **feed)
    assert g.ids == want_ids[0, ids.shape[1]:].tolist()


def test_gemma3_text_only_input_runs_its_language_model(built):
    """Ids alone (no picture) through the vision-language module: Gemma 3's text path, causal with windows."""
    hf, folder = built("gemma3")
    m = ax.load_model(str(folder), device="cpu")
    ids = torch.randint(5, 290, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf.model(input_ids=ids, output_attentions=True)
    with torch.inference_mode():
        ours = m.module(input_ids=ids, output_attentions=True)
    assert max((ours.attentions[:, i] - a).abs().max().item() for i, a in enumerate(ref.attentions)) <= TOL
    assert (ours.hidden - ref.last_hidden_state).abs().max().item() <= TOL


def _folder_with(folder, tmp_path, change: dict, pp: dict | None = None):
    cfg = dict(json.loads((folder / "config.json").read_text()), **change)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    if pp is not None:
        (tmp_path / "preprocessor_config.json").write_text(json.dumps(pp))
    for f in folder.iterdir():
        if not (tmp_path / f.name).exists():
            (tmp_path / f.name).symlink_to(f)
    return tmp_path


@pytest.mark.parametrize("name,change,pp,words", [
    ("gemma3", dict(mm_tokens_per_image=15), None, "gemma3: mm_tokens_per_image must be a square number"),
    ("gemma3", dict(mm_tokens_per_image=9), None, "whose side divides the tower's patch grid"),
    ("gemma3", dict(image_token_index=7), None, "gemma3: the tokenizer has no <image_soft_token> token with id 7"),
    ("gemma3", dict(boi_token_index=8), None, "gemma3: the tokenizer has no <start_of_image> token with id 8"),
    ("gemma3", {}, dict(do_pan_and_scan=True), "gemma3: preprocessor_config.json's do_pan_and_scan"),
    ("gemma3", dict(vision_config="siglip"), None, "gemma3: config.json's vision_config must be an object"),
    ("llava_onevision", dict(vision_feature_select_strategy="default"), None,
     "llava_onevision: vision_feature_select_strategy must be 'full'"),
    ("llava_onevision", dict(vision_aspect_ratio="anyres"), None, "llava_onevision: vision_aspect_ratio must be"),
    ("llava_onevision", dict(image_grid_pinpoints=[[32, 48]]), None, "in whole multiples of the tower's image_size"),
    ("llava_onevision", dict(vision_feature_layer=[-2, -1]), None, "list of vision_feature_layer"),
    ("llava_onevision", {}, dict(image_grid_pinpoints=[[32, 32]]), "image_grid_pinpoints differ"),
    ("gemma3", dict(vision_config=dict(SIGLIP, model_type="clip_vision_model")), None,
     "gemma3: vision_config.model_type must be 'siglip_vision_model', got 'clip_vision_model'"),
    ("llava_onevision", dict(vision_config=dict(SIGLIP, model_type="clip_vision_model")), None,
     "llava_onevision: vision_config.model_type must be 'siglip_vision_model'"),
])
def test_bad_config_fields_are_one_line(built, tmp_path, name, change, pp, words):
    _, folder = built(name)
    with pytest.raises(UserError, match=words) as e:
        ax.load_model(str(_folder_with(folder, tmp_path, change, pp)), device="cpu").run(picture(), text="hi")
    assert "\n" not in str(e.value)


def test_bad_prompts(built):
    _, folder = built("gemma3")
    m = ax.load_model(str(folder), device="cpu")
    with pytest.raises(UserError, match="2 image placeholders for 1 image"):
        m.run(picture(), text="<start_of_image> and <image>")
    with pytest.raises(UserError, match="gemma3 is a vision-language model: give it an image"):
        m.run("what is on the mat?")
