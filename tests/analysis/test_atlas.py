"""The head atlas (issue 27): planted heads found and ranked first, every metric against a dense reference, the
copy score against full logits, examples that point where they say, save/load, stop and progress."""
from __future__ import annotations

import numpy as np
import pytest

import attn_explorer as ax
from attn_explorer.analysis import atlas_math
from attn_explorer.analysis.atlas import METRICS, ROLE_THRESHOLDS, Atlas, Example, suggest_roles
from attn_explorer.analysis.atlas_build import build_atlas
from attn_explorer.analysis.atlas_induction import induction_scores
from attn_explorer.core.progress import Stopped
from attn_explorer.errors import UserError
from tests.analysis.atlas_planted import INDUCTION_HEAD, PREV_HEAD, make_planted_folder, repeated_documents
from tests.tiny_llama import make_llama_folder

TEXTS = ["The cat sat on the mat. The cat sat on the mat again, and the dog sat too.",
         "Attention lets every token look at the tokens before it; every token, every time.",
         "What is the capital of Spain? Madrid is the capital of Spain."]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return ax.load_model(str(make_planted_folder(tmp_path_factory.mktemp("planted") / "m")), device="cpu")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return ax.load_model(str(make_llama_folder(tmp_path_factory.mktemp("llama") / "m")), device="cpu")


@pytest.fixture(scope="module")
def planted_atlas(planted):
    return build_atlas(planted, repeated_documents(), top_k=4)


def test_planted_heads_are_labelled_and_ranked_first(planted_atlas):
    a = planted_atlas
    roles = suggest_roles(a)
    assert "previous-token" in roles[PREV_HEAD] and "induction" in roles[INDUCTION_HEAD]
    assert [hd for hd, rs in roles.items() if "previous-token" in rs] == [PREV_HEAD]
    assert [hd for hd, rs in roles.items() if "induction" in rs] == [INDUCTION_HEAD]
    assert a.ranked("prev_token")[0][:2] == PREV_HEAD and a.ranked("induction")[0][:2] == INDUCTION_HEAD
    # the induction head copies (its OV writes the attended token's embedding); the others do not
    assert a.ranked("copy")[0][:2] == INDUCTION_HEAD and a.metrics["copy"][INDUCTION_HEAD] > 2
    assert abs(a.metrics["copy"][PREV_HEAD]) < 0.1
    print("planted:", {k: round(float(v[INDUCTION_HEAD]), 3) for k, v in a.metrics.items()})


def test_planted_examples_point_at_the_pattern(planted_atlas, planted):
    for ex in planted_atlas.head_examples(*INDUCTION_HEAD, metric="induction"):
        toks = planted.prepare(planted_atlas.texts[ex.doc]).tokens
        assert ex.key >= 1 and toks[ex.key - 1] == toks[ex.query]  # the token after an earlier copy of the query's
        assert ex.tokens[ex.query_at] == toks[ex.query] and ex.tokens[ex.key_at] == toks[ex.key]
    for ex in planted_atlas.head_examples(*PREV_HEAD, metric="prev_token"):
        assert ex.key == ex.query - 1 and ex.weight > 0.9


def test_induction_scores_rank_the_planted_head_first(planted):
    s = induction_scores(planted, seq_len=50, batches=3)
    assert s.seq_len == 32  # cut to the model's 64 positions
    assert s.ranked()[0][:2] == INDUCTION_HEAD and s.scores[INDUCTION_HEAD] > 0.3
    assert s.scores[PREV_HEAD] < 0.05


def _dense_reference(model, texts):
    """Each metric from the dense maps of model.run, summed the atlas's way (numpy, row by row)."""
    L, H = model.info.num_layers, model.info.num_heads
    sums = {k: np.zeros((L, H)) for k in METRICS if k != "copy"}
    counts = {k: 0 for k in sums}
    for text in texts:
        prep = model.prepare(text)
        att = model.run(text).attentions.astype(np.float64)  # (L, H, N, N)
        ids = prep.inputs["input_ids"][0].numpy()
        sp = np.asarray(prep.special, dtype=bool)
        n = len(ids)
        sink = sp.copy()
        sink[0] = True
        for i in range(n):
            a = att[:, :, i]  # (L, H, N)
            if i >= 1 or not model.info.causal:
                p = np.where(a > 0, a, 1.0)
                sums["entropy"] += -(a * np.log2(p)).sum(-1)
                sums["sink"] += a[..., sink].sum(-1)
                sums["distance"] += (a * np.abs(i - np.arange(n))).sum(-1)
                for k in ("entropy", "sink", "distance"):
                    counts[k] += 1
            if i >= 1:
                sums["prev_token"] += a[..., i - 1]
                counts["prev_token"] += 1
            dup = [j for j in range(i) if ids[j] == ids[i] and not sp[i] and not sp[j]]
            if dup:
                sums["duplicate"] += a[..., dup].sum(-1)
                counts["duplicate"] += 1
            ind = [j for j in range(1, i) if ids[j - 1] == ids[i] and not sp[i]]
            if ind:
                sums["induction"] += a[..., ind].sum(-1)
                counts["induction"] += 1
    return {k: sums[k] / counts[k] for k in sums}


@pytest.mark.parametrize("which", ["llama", "minilm"])
def test_metrics_equal_the_dense_reference(which, llama, request):
    model = llama if which == "llama" else request.getfixturevalue("minilm")
    a = build_atlas(model, TEXTS, top_k=2)
    ref = _dense_reference(model, TEXTS)
    worst = {k: float(np.abs(a.metrics[k] - ref[k]).max()) for k in ref}
    print(which, "atlas vs dense:", worst)
    assert all(v < 2e-5 for v in worst.values()), worst
    assert a.tokens == sum(len(model.prepare(t).tokens) for t in TEXTS) and a.documents == 3
    if which == "minilm":
        assert np.isnan(a.metrics["copy"]).all() and "no copy score" in a.notes["copy"]


def test_row_chunks_and_segments_do_not_change_the_metrics(llama, monkeypatch):
    whole = build_atlas(llama, TEXTS, top_k=2)
    monkeypatch.setattr(atlas_math, "CHUNK_CELLS", 6 * 5 * 40)  # a few rows at a time
    chunked = build_atlas(llama, TEXTS, top_k=2)
    for k in METRICS:
        np.testing.assert_allclose(chunked.metrics[k], whole.metrics[k], atol=1e-5, err_msg=k)
    monkeypatch.setattr(atlas_math, "_plain", lambda o: False)  # the general path (windows, masks, soft-caps)
    general = build_atlas(llama, TEXTS, top_k=2)
    for k in METRICS:
        np.testing.assert_allclose(general.metrics[k], whole.metrics[k], atol=1e-5, err_msg=k)
    assert general.examples.keys() == whole.examples.keys()
    cut = build_atlas(llama, ["\n\n".join(TEXTS)], top_k=2, context=24)  # one document, several segments
    assert cut.documents == 1 and len({e.doc for ex in cut.examples.values() for e in ex}) > 1


def test_copy_score_equals_full_logits(llama):
    """CopyReader.z: the z-score of each key's own token among all V logits of the head's direct output."""
    import torch

    from attn_explorer.analysis.residual import decoder_parts

    reader = atlas_math.CopyReader(llama)
    assert reader.ok
    prep = llama.prepare(TEXTS[0])
    _, cache = llama.run_with_cache(TEXTS[0], names=["blocks.1.attn.hook_v"])
    from attn_explorer.api.hooks import heads_first

    v = heads_first(cache["blocks.1.attn.hook_v"], llama.info.num_heads)[0].float()
    ids = prep.inputs["input_ids"][0]
    z = reader.z(1, v, ids)
    parts = decoder_parts(llama.module)
    W = llama.W_O(1).float()
    gain = parts.final_norm.weight.float()
    logits = torch.einsum("hnd,hde->hne", v, W) * gain @ parts.unembed.float().T  # (H, n, V)
    ref = (logits[:, torch.arange(len(ids)), ids] - logits.mean(-1)) / logits.std(-1, unbiased=False)
    torch.testing.assert_close(z, ref, atol=1e-4, rtol=1e-4)


def test_examples_weights_are_the_maps(llama):
    a = build_atlas(llama, TEXTS, top_k=3)
    for (l, h), exs in a.examples.items():
        assert len(exs) <= 3 * (1 + len(METRICS))
        for ex in exs:
            text = a.texts[ex.doc]
            att = llama.run(text).attentions[l, h]
            assert ex.weight == pytest.approx(float(att[ex.query, ex.key]), abs=1e-5)
            if ex.metric == "weight":
                assert ex.key != ex.query and ex.key != 0
    assert set(a.texts) == {e.doc for exs in a.examples.values() for e in exs}  # only what examples point at
    best = a.head_examples(1, 0, "weight")
    assert [e.weight for e in best] == sorted((e.weight for e in best), reverse=True)


def test_save_and_load_round_trip(planted_atlas, tmp_path):
    p = tmp_path / "a.npz"
    planted_atlas.save(p)
    b = Atlas.load(p)
    assert (b.model, b.n_layers, b.n_heads, b.tokens, b.documents) == (planted_atlas.model, 2, 2, 720, 12)
    for k in METRICS:
        np.testing.assert_array_equal(b.metrics[k], planted_atlas.metrics[k])
    assert b.examples == planted_atlas.examples and b.texts == planted_atlas.texts and b.notes == planted_atlas.notes
    assert suggest_roles(b) == suggest_roles(planted_atlas)
    with np.load(p) as z:
        assert {f"metric_{k}" for k in METRICS} <= set(z.files)


@pytest.mark.parametrize("content,words", [
    (None, "no atlas file"), (b"not a zip", "not a readable .npz"), ("other", "not an atlas"), ("bad", "damaged")])
def test_a_bad_atlas_file_is_one_line(tmp_path, content, words):
    p = tmp_path / "x.npz"
    if content == "other":
        np.savez(p, a=np.zeros(3))
    elif content == "bad":
        np.savez(p, atlas_version=np.array(1), shape=np.array([2, 2]), metric_entropy=np.zeros((3, 3)))
    elif content is not None:
        p.write_bytes(content)
    with pytest.raises(UserError, match=words):
        Atlas.load(p)


def test_stop_returns_a_partial_atlas_and_progress_counts_tokens(llama):
    seen = []
    a = build_atlas(llama, TEXTS, progress=lambda d, t: seen.append((d, t)), stop=lambda: len(seen) >= 1)
    assert not a.complete and a.documents <= 2 and len(seen) == 1 and a.tokens == seen[0][0]
    seen.clear()
    full = build_atlas(llama, TEXTS, progress=lambda d, t: seen.append((d, t)))
    assert full.complete and [d for d, _ in seen] == sorted(d for d, _ in seen) and seen[-1][0] == seen[-1][1]
    with pytest.raises(Stopped):
        build_atlas(llama, TEXTS, stop=lambda: True)
    capped = build_atlas(llama, TEXTS, max_tokens=20)
    assert capped.tokens <= 20 + llama.info.min_tokens and not np.isnan(capped.metrics["entropy"]).any()


def test_refusals_are_one_line(llama):
    with pytest.raises(UserError, match="no text"):
        build_atlas(llama, ["   ", "\n"])
    with pytest.raises(UserError, match="top_k"):
        build_atlas(llama, TEXTS, top_k=0)


def test_roles_follow_the_stated_thresholds():
    L, H = 2, 3
    m = {k: np.zeros((L, H)) for k in METRICS}
    m["prev_token"][0, 1] = ROLE_THRESHOLDS["previous-token"][1]
    m["sink"][1, 2] = 0.99
    m["induction"][1, 0] = np.nan
    a = Atlas("x", L, H, 10, 1, m, {})
    assert suggest_roles(a) == {(0, 1): ["previous-token"], (1, 2): ["sink"]}
    m["retrieval"] = np.zeros((L, H))
    m["retrieval"][1, 1] = 0.5
    assert suggest_roles(Atlas("x", L, H, 10, 1, m, {}))[(1, 1)] == ["retrieval"]


def test_example_window_marks_query_and_key():
    from attn_explorer.analysis.atlas_build import context_window

    toks = [f"t{i}" for i in range(200)]
    w, qa, ka = context_window(toks, 150, 10, 5)
    assert w[qa] == "t150" and w[ka] == "t10" and "…" in w and len(w) == 23
    w, qa, ka = context_window(toks, 12, 10, 5)
    assert w[qa] == "t12" and w[ka] == "t10" and "…" not in w
    assert Example(0, 1, 0, 0.5, "weight", w, qa, ka).metric == "weight"


def test_offering_a_layer_at_once_keeps_what_offering_each_in_turn_keeps():
    """atlas_build._push offers only each head's best top_k of a layer's candidates (ties: the earlier): the heaps
    end as if every candidate had been offered in turn, ties and the best() order included."""
    import torch

    from attn_explorer.analysis.atlas import TopK
    from attn_explorer.analysis.atlas_build import _push

    g = torch.Generator().manual_seed(0)
    H, k = 3, 4
    for trial in range(20):
        cands = []
        for _ in range(5):  # chunks
            m = int(torch.randint(0, 12, (1,), generator=g))
            hs = torch.randint(0, H, (m,), generator=g)
            scores = torch.randint(0, 6, (m,), generator=g).float() / 5  # many ties
            qs = torch.randint(0, 100, (m,), generator=g)
            cands.append((hs, qs, qs + 1, scores, scores) if m else None)
        seen = [TopK(k) for _ in range(H)]
        batched = {(0, h, "x"): TopK(k) for h in range(H)}
        for h in range(H):  # the same heaps before the layer
            for s in (0.2, 0.4):
                seen[h].offer(s, (0, -1, -1, s, "x", s)), batched[(0, h, "x")].offer(s, (0, -1, -1, s, "x", s))
        for c in cands:
            if c is not None:
                for h, q, kk, w, s in zip(*(t.tolist() for t in c)):
                    seen[h].offer(s, (1, q, kk, w, "x", s))
        floors = _push(cands, 0, "x", batched, k, 1, lambda key, s, item: batched[key].offer(s, item), H)
        for h in range(H):
            assert batched[(0, h, "x")].best() == seen[h].best(), trial
            assert float(floors[h]) == float(torch.tensor(seen[h].floor()))  # float32, as the floors are kept


def test_copy_statistics_are_reused_until_the_unembedding_changes(llama):
    """CopyReader keeps ū and Σ_U per unembedding tensor: a second reader of the same model reuses them; an
    in-place edit of W_U (its version moves) makes the next reader work them out again, equal to a fresh pass."""
    import torch

    from attn_explorer.analysis.residual import decoder_parts

    a, b = atlas_math.CopyReader(llama), atlas_math.CopyReader(llama)
    assert b.cov is a.cov and b.mean is a.mean
    U = decoder_parts(llama.module).unembed
    with torch.no_grad():
        U.mul_(2.0)
    try:
        c = atlas_math.CopyReader(llama)
        assert c.cov is not a.cov
        torch.testing.assert_close(c.cov, 4 * a.cov, rtol=1e-4, atol=1e-6)
        fresh = atlas_math.CopyReader.__new__(atlas_math.CopyReader)
        fresh.U, fresh.gain, fresh.centre = c.U, c.gain, c.centre
        fresh._compute_stats()
        assert torch.equal(fresh.cov, c.cov) and torch.equal(fresh.mean, c.mean)
    finally:
        with torch.no_grad():
            U.mul_(0.5)


def test_the_texts_kept_are_only_those_examples_point_at():
    """atlas_build.Pointed: what an atlas keeps of its corpus is bounded by its heaps, whatever the corpus size: a
    segment whose every heap item was pushed out (within its own segment or later) leaves nothing behind."""
    from attn_explorer.analysis.atlas_build import Pointed

    kept = Pointed()
    for seg in range(1000):
        kept.kept(seg)
        if seg % 10:  # pushed out again, within its own segment
            kept.dropped(seg)
        if seg % 10 == 0 and seg >= 10:  # the one kept before it, pushed out later
            kept.dropped(seg - 10)
        kept.end(seg, (f"text {seg}", 1024, "src"))
    assert set(kept.texts) == {990} and set(kept.refs) == {990}


@pytest.mark.parametrize("plain", [True, False])
def test_layer_values_and_candidate_rows_equal_the_dense_maps(llama, monkeypatch, plain):
    """atlas_math.layer_values (every row's value by each kind, in row chunks) and row_probs (a few (head, row)
    pairs worked out again) against the dense maps of one run, on the fast path and the general one; the weight
    row is the largest weight off the token itself and the sinks, and candidate_keys("weight") points at it."""
    import torch

    if not plain:
        monkeypatch.setattr(atlas_math, "_plain", lambda o: False)
    monkeypatch.setattr(atlas_math, "CHUNK_CELLS", 6 * 5 * 40)  # several chunks
    text = TEXTS[0] + " " + TEXTS[2]
    prep = llama.prepare(text)
    ids = prep.inputs["input_ids"][0]
    att = torch.as_tensor(llama.run(text).attentions)  # (L, H, n, n)
    t = llama.trace(prep, lazy=True)
    pairs = atlas_math.segment_pairs(ids.numpy(), np.asarray(prep.special, dtype=bool))
    n = len(ids)
    K = atlas_math.KINDS
    for l, lz in enumerate(t.lazy.layers):
        a = att[l].float()
        vals = atlas_math.layer_values(lz, pairs, None, True)
        ent = -(a * torch.where(a > 0, a, 1.0).log2()).sum(-1)
        torch.testing.assert_close(vals[K.index("entropy")][:, 1:], ent[:, 1:], atol=2e-5, rtol=0)
        torch.testing.assert_close(vals[K.index("sink")], a[..., 0], atol=2e-6, rtol=0)
        off = a.clone()
        off[:, torch.arange(n), torch.arange(n)] = 0.0
        off[..., pairs.sink_cols] = 0.0
        torch.testing.assert_close(vals[K.index("weight")], off.amax(-1), atol=2e-6, rtol=0)
        hs = torch.tensor([0, 1, 1, 0])
        rs = torch.tensor([n - 1, 3, n - 1, 5])
        ka = atlas_math.widened_keys(lz)
        assert (ka is not None) == plain
        rows = atlas_math.row_probs(lz, hs, rs, ka)
        torch.testing.assert_close(rows, a[hs, rs], atol=2e-6, rtol=0)
        keys = atlas_math.candidate_keys("weight", rows.clone(), rs, hs, pairs, None)
        assert keys.tolist() == off[hs, rs].argmax(-1).tolist()


def test_a_bfloat16_layer_with_rounded_logits_is_measured_as_its_tiles_are(monkeypatch):
    """Issue 24 B: where a bfloat16 model's lazy layer rounded its logits (core.bf16_attention, LayerOptions.rounded),
    its lse is that of the rounded logits: the atlas must form them the same way (the general path), or its rows
    are 1-6 % off and do not sum to 1."""
    import torch

    from attn_explorer.api.lazy import LazyLayer
    from attn_explorer.core import lazy as core_lazy

    from attn_explorer.core import bf16_attention

    monkeypatch.setattr(core_lazy, "native_bf16", lambda: True)
    monkeypatch.setattr(bf16_attention, "MODE", "always")  # a global layer: the kernel where it may not pay
    g = torch.Generator().manual_seed(0)
    q, k, v = ((torch.randn(1, h, 200, 64, generator=g) * 2).bfloat16() for h in (4, 2, 2))
    from types import SimpleNamespace

    call = SimpleNamespace(causal=True, window=None, softcap=None, mask=None, dk_scale=1.0, scale=None, chunk=None)
    assert core_lazy.rounded_logits(q, k, v, call)
    _, lse = core_lazy.keep_attention(q, k, v, call, 64)
    o = core_lazy.LayerOptions.of(call, 64, rounded=True)
    lz = LazyLayer(q, k, lse, o)
    hs, rs = torch.tensor([0, 3, 1]), torch.tensor([199, 150, 40])
    rows = atlas_math.row_probs(lz, hs, rs, atlas_math.widened_keys(lz))
    want = torch.stack([core_lazy.head_probs(q, k, lse, o, int(h))[int(r)] for h, r in zip(hs, rs)])
    torch.testing.assert_close(rows, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(rows.sum(-1), torch.ones(3), atol=1e-5, rtol=0)
