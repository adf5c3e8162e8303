"""Head interventions (analysis.interventions): batched scans against one run per head, a planted head found
first, patching every head from the clean run giving the clean output, the metrics that fit each model
(MiniLM's embedding as sentence-transformers computes it, tiny-vit-digits' class probabilities), and bad
input as one line."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import attn_explorer as ax
from attn_explorer.analysis import interventions as iv
from attn_explorer.errors import UserError
from tests.tiny_llama import make_llama_folder

TEXT = "The capital of France is Paris. The capital of Italy is"
CLEAN, CORRUPT = "The capital of France is", "The capital of Italy is"  # 8 tokens each


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = make_llama_folder(tmp_path_factory.mktemp("llama"), num_hidden_layers=3)
    return ax.load_model(str(folder), device="cpu")


def _one_run(m, x, ablate, metric):
    """The metric of m.run's own ablation, from a plain forward with its hooks on attn.hook_z (the reference)."""
    from attn_explorer.api.hooks import ablation_hooks

    prep = m.prepare(x)
    t = m.trace(prep, hooks=ablation_hooks(ablate, m.info))
    return float(metric(m.module, t.out)[0])


@pytest.mark.parametrize("how", ["zero", "mean"])
def test_the_batched_scan_equals_one_run_per_head(llama, how):
    metric = iv.metric(llama, TEXT, target=" capital")
    scan = iv.ablation_scan(llama, TEXT, metric, how=how, batch=5)  # 18 heads: 4 passes, the last one short
    L, H = llama.info.num_layers, llama.info.num_heads
    assert scan.values.shape == (L, H) and scan.passes == 4
    ref = np.array([[_one_run(llama, TEXT, {(l, h): how}, metric) for h in range(H)] for l in range(L)])
    np.testing.assert_allclose(scan.values, ref, atol=1e-5, rtol=0)
    assert np.abs(scan.effect).max() > 1e-3  # heads matter here: the comparison is not between constants
    assert scan.clean == pytest.approx(_one_run(llama, TEXT, {}, metric), abs=1e-6)


def test_a_planted_head_is_found_first(llama, tmp_path):
    folder = make_llama_folder(tmp_path / "planted", num_hidden_layers=3, seed=3)
    m = ax.load_model(str(folder), device="cpu")
    d = m.module.cfg.head_dim
    with torch.no_grad():  # L1 H4 writes 30x louder than any other head
        m.module.blocks.layers[1].attn.out.weight[:, 4 * d:5 * d] *= 30
    seen = []
    scan = iv.ablation_scan(m, TEXT, progress=lambda f, msg: seen.append((f, msg)))
    assert scan.ranked(1)[0][:2] == (1, 4)
    assert seen[0][0] == 0 and seen[-1][0] == 1.0 and seen[-1][1] == "18 of 18 heads"
    assert [f for f, _ in seen] == sorted(f for f, _ in seen)


def test_a_planted_head_is_found_first_by_the_encoder_similarity(minilm):
    with torch.no_grad():
        w = minilm.module.blocks.layers[2].attn.out.weight
        saved = w.clone()
        w[:, 7 * 32:8 * 32] *= 40
    try:
        scan = iv.ablation_scan(minilm, "The animal didn't cross the street because it was too tired.")
    finally:
        with torch.no_grad():
            w.copy_(saved)
    assert scan.metric.startswith("cosine") and scan.clean == pytest.approx(1.0, abs=1e-6)
    assert scan.ranked(1)[0][:2] == (2, 7)
    assert scan.values.max() <= 1 + 1e-6


def test_patching_every_head_from_the_clean_run_gives_the_clean_output(llama):
    p = iv.patch(llama, CLEAN, CORRUPT, target=" capital")
    assert abs(p.clean - p.corrupt) > 1e-3  # the two inputs differ where it counts
    assert p.patched == pytest.approx(p.clean, abs=1e-6)
    assert p.restored == pytest.approx(1.0, abs=1e-4)
    nothing = iv.patch(llama, CLEAN, CORRUPT, target=" capital", heads=[])
    assert nothing.patched == pytest.approx(nothing.corrupt, abs=1e-6)


def test_the_patching_scans_equal_single_patches(llama):
    metric = iv.metric(llama, CLEAN, target=" capital", foil=" of")
    heads = iv.patching_scan(llama, CLEAN, CORRUPT, metric, per="head", batch=7)
    for l, h in [(0, 0), (1, 3), (2, 5)]:
        one = iv.patch(llama, CLEAN, CORRUPT, metric, heads=[(l, h)])
        assert heads.values[l, h] == pytest.approx(one.patched, abs=1e-5)
    n = len(heads.tokens)
    cells = iv.patching_scan(llama, CLEAN, CORRUPT, metric, per="position")
    assert cells.values.shape == (llama.info.num_layers, n)
    H = llama.info.num_heads
    for l, pos in [(0, 0), (2, n - 1), (1, 2)]:
        one = iv.patch(llama, CLEAN, CORRUPT, metric, heads=[(l, h) for h in range(H)], positions=[pos])
        assert cells.values[l, pos] == pytest.approx(one.patched, abs=1e-5)
    # the last layer at the last position carries everything the next token reads from the heads there
    assert cells.effect[-1, n - 1] != pytest.approx(0.0, abs=1e-3)


def test_minilm_embedding_is_sentence_transformers_mean_pooling(minilm):
    st = pytest.importorskip("sentence_transformers")
    from attn_explorer.hub.load import minilm_folder

    text = "The animal didn't cross the street because it was too tired."
    ref = st.SentenceTransformer(str(minilm_folder()), device="cpu").encode([text], normalize_embeddings=True)[0]
    prep = minilm.prepare(text)
    out, _ = iv.forward(minilm, prep.inputs)
    ours = iv.embedding(out.hidden, "mean")[0].numpy()
    np.testing.assert_allclose(ours / np.linalg.norm(ours), ref, atol=1e-5)
    ablated = iv.compare(minilm, text, {(0, 0): "zero", (3, 1): "mean"})
    assert ablated.kind == "similarity" and 0.5 < ablated.similarity < 1 - 1e-7


def test_tiny_vit_digits_class_probabilities():
    m = ax.load_model("tiny-vit-digits", device="cpu")
    from attn_explorer.session.state import sample_images  # noqa: F401 - the app's samples folder
    from PIL import Image

    digit = np.zeros((8, 8), dtype=np.uint8)
    digit[1:7, 3:5] = 255  # a white "1" on black
    img = Image.fromarray(digit).convert("RGB")
    c = iv.compare(m, img, {(1, 0): "zero", (1, 1): "zero", (1, 2): "zero", (1, 3): "zero"})
    assert c.kind == "classifier" and len(c.labels) == len(c.before) == len(c.after) == m.module.cfg.num_labels
    assert c.before.sum() == pytest.approx(1.0, abs=1e-5) and c.after.sum() == pytest.approx(1.0, abs=1e-5)
    top = m.run(img).top5[0]
    assert c.labels[int(np.argmax(c.before))] == top[0] and c.before.max() == pytest.approx(top[1], abs=1e-5)
    assert np.abs(c.after - c.before).max() > 1e-3
    scan = iv.ablation_scan(m, img)
    assert scan.metric.startswith("p(class") and scan.values.shape == (2, 4)


def test_decoder_comparison_shows_both_runs_top_tokens(llama):
    c = iv.compare(llama, TEXT, {(l, h): "zero" for l in range(3) for h in range(6)}, top=5)
    assert c.kind == "decoder" and 5 <= len(c.labels) <= 10 and c.heads == 18
    assert np.all(np.diff(c.before) <= 0)  # ordered by the clean run's probability
    assert np.abs(c.after - c.before).max() > 1e-3


def test_bad_input_is_one_line(llama):
    cases = [
        (lambda: iv.metric(llama, TEXT, target=" Romeward bound"), "not one"),
        (lambda: iv.patch(llama, "The capital", CORRUPT, target=" capital"), "same number of tokens"),
        (lambda: iv.patch(llama, CLEAN, CORRUPT, heads=[(3, 0)]), "no head L3 H0"),
        (lambda: iv.patch(llama, CLEAN, CORRUPT, positions=[99]), "no position 99"),
        (lambda: iv.ablation_scan(llama, TEXT, how="half"), "unknown ablation"),
        (lambda: iv.metric(llama, TEXT, target=" of", foil=" of"), "same token"),
    ]
    for call, words in cases:
        with pytest.raises(UserError) as e:
            call()
        assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
