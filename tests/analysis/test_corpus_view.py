"""The corpus view's gathering and embedding (analysis.corpus), on a tiny BERT built and planted in the test."""
from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.analysis.corpus import (Corpus, HeadPoints, align_keys, corpus_arrays, gather, joint_embedding,  # noqa: E402
                                           parse_heads, read_sentences, run_corpus)
from attn_explorer.analysis.stats import head_stats  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402

GROUP_A = ["red", "blue", "green", "pink"]
GROUP_B = ["cat", "dog", "cow", "pig"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + GROUP_A + GROUP_B + ["the", "a", "is", "on"]


def tiny_bert(folder, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=48, max_position_embeddings=64, attn_implementation="eager")
    transformers.BertModel(cfg).eval().save_pretrained(folder, safe_serialization=True)
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return ax.load_model(str(folder), device="cpu")


def plant(m, layer=1, head=2):
    """Make head (layer, head) tell group A from group B: A words embed along +v, B along -v, and the head's
    query and key read v alone; every other direction is small noise."""
    enc = m.module
    g = torch.Generator().manual_seed(1)
    D = enc.cfg.dim
    v = torch.zeros(D)
    v[: D // 2], v[D // 2:] = 1.0, -1.0  # zero mean: LayerNorm keeps its direction
    with torch.no_grad():
        enc.embeddings.word.weight.normal_(0, 0.05, generator=g)
        for w in GROUP_A:
            enc.embeddings.word.weight[VOCAB.index(w)] += v
        for w in GROUP_B:
            enc.embeddings.word.weight[VOCAB.index(w)] -= v
        enc.embeddings.position.weight.zero_()
        enc.embeddings.token_type.weight.zero_()
        for blk in enc.blocks.layers:  # every layer passes the embedding on almost as it is
            blk.attn.out.weight.mul_(0.01)
            blk.mlp.fc2.weight.mul_(0.01) if hasattr(blk.mlp, "fc2") else None
        attn = enc.blocks.layers[layer].attn
        d = attn.head_dim
        rows = slice(head * d, (head + 1) * d)
        for lin in (attn.query, attn.key):
            lin.weight[rows] = 0.0
            lin.weight[rows][0] = v / v.norm()
            lin.bias[rows] = 0.0
        attn.packed_qkv.clear()
    return m


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return tiny_bert(tmp_path_factory.mktemp("bert"))


def sentences(n=40, seed=0):
    rng = np.random.default_rng(seed)
    words = GROUP_A + GROUP_B + ["the", "a", "is", "on"]
    return [" ".join(rng.choice(words, size=int(rng.integers(3, 9)))) for _ in range(n)]


def test_a_planted_head_separates_two_token_groups(tmp_path):
    m = plant(tiny_bert(tmp_path / "planted"))
    c = run_corpus(m, sentences(), [(1, 2), (0, 0)])
    pts = c.points(1, 2)
    e = joint_embedding(pts)
    P = len(pts.q)
    x = e.xy[:P, 0]  # queries along the first axis
    a = np.isin(pts.token, GROUP_A)
    b = np.isin(pts.token, GROUP_B)
    assert a.sum() > 10 and b.sum() > 10
    # the two groups fall on opposite sides of the first principal axis, with no overlap
    lo, hi = sorted([x[a], x[b]], key=np.mean)
    assert lo.max() < hi.min()
    # and the planted head explains most of its variance in one direction
    assert e.explained[0] > 0.8


def test_an_unplanted_head_does_not_separate_them(bert):
    """The test above can fail: a random head mixes the two groups."""
    c = run_corpus(bert, sentences(), [(1, 2)])
    pts = c.points(1, 2)
    x = joint_embedding(pts).xy[: len(pts.q), 0]
    a, b = np.isin(pts.token, GROUP_A), np.isin(pts.token, GROUP_B)
    lo, hi = sorted([x[a], x[b]], key=np.mean)
    assert lo.max() >= hi.min()


def test_statistics_per_sentence_are_the_overviews(bert):
    texts = sentences(6)
    c = run_corpus(bert, texts, [(0, 1)])
    for i, t in enumerate(texts):
        r = bert.run(t)
        s = head_stats(r.attentions, r.special)
        for name in ("entropy", "sink", "distance", "prev", "next"):
            np.testing.assert_allclose(c.stats[name][i], s.get(name), atol=1e-5)
    np.testing.assert_allclose(c.mean("entropy"), c.stats["entropy"].mean(0))
    assert c.tokens_seen == sum(len(t) for t in c.tokens) and c.complete


def test_fire_and_top_sentences():
    att = np.zeros((1, 1, 4, 4), dtype=np.float32)
    att[0, 0, :, 0] = 1.0  # everything on [CLS]
    special = np.array([True, False, False, True])
    from attn_explorer.analysis.corpus import _fire

    assert _fire(att, special)[0, 0] == 0.0  # weight on a special token does not count
    att[0, 0, 1, 2], att[0, 0, 2, 2] = 0.7, 0.9  # 1 -> 2 counts; 2 -> itself does not
    assert _fire(att, special)[0, 0] == pytest.approx(0.7)
    c = Corpus(model="x", sentences=["a", "b", "c"], tokens=[[], [], []], stats={},
               fire=np.array([0.1, 0.9, 0.5], dtype=np.float32).reshape(3, 1, 1))
    assert [i for i, _ in c.top_sentences(0, 0, 2)] == [1, 2]


def test_memory_stays_bounded_by_the_sample(bert):
    c = run_corpus(bert, sentences(60), [(0, 0)], max_points=50)
    pts = c.points(0, 0)
    assert len(pts.q) == 50 and pts.q.shape == pts.k.shape
    # a uniform sample: late sentences are in it too, not only the first tokens seen
    assert pts.sentence.max() > 30
    # each kept point's q is the token's real query
    i = int(np.argmax(pts.sentence))
    prep = bert.prepare(c.sentences[pts.sentence[i]])
    t = bert.trace(prep, names=["blocks.0.attn.hook_q"])
    r_q = t.cache["blocks.0.attn.hook_q"][0, pts.position[i], 0].numpy()  # (B, N, H, d): head 0
    np.testing.assert_allclose(pts.q[i], r_q, atol=1e-6)


def test_alignment_changes_no_attention_weight():
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(20, 8)) * 3 + 1, rng.normal(size=(20, 8)) - 2
    q2, k2 = align_keys(q, k)
    soft = lambda s: np.exp(s - s.max(1, keepdims=True)) / np.exp(s - s.max(1, keepdims=True)).sum(1, keepdims=True)  # noqa: E731
    np.testing.assert_allclose(soft(q2 @ k2.T), soft(q @ k.T), atol=1e-10)
    np.testing.assert_allclose(k2.mean(0), q2.mean(0), atol=1e-10)
    # before the translation the mean norms agree: q2 is q scaled by c, and (k2 - shift) is k / c
    c = np.linalg.norm(q2[0]) / np.linalg.norm(q[0])
    np.testing.assert_allclose(np.linalg.norm(q * c, axis=1).mean(), np.linalg.norm(k / c, axis=1).mean(), rtol=1e-10)


def test_stopping_early_keeps_what_ran(bert):
    texts = sentences(10)
    seen = []
    out = list(gather(bert, texts, [(0, 0)], should_stop=lambda: len(seen) >= 3 or seen.append(1)))
    c = out[-1]
    assert isinstance(c, Corpus) and c.num_sentences == 3 and not c.complete
    assert [x for x in out[:-1]] == [(1, 10), (2, 10), (3, 10)]


def test_bad_corpora_and_heads_are_one_line(bert):
    with pytest.raises(UserError, match="no sentences"):
        read_sentences("\n  \n")
    with pytest.raises(UserError, match="at most 3"):
        read_sentences("a\nb\nc\nd", limit=3)
    assert read_sentences("a\n\n b \n") == ["a", "b"]
    with pytest.raises(UserError, match="layer:head"):
        parse_heads("3-1", 2, 4)
    with pytest.raises(UserError, match="no head L2 H0"):
        parse_heads("2:0", 2, 4)
    assert parse_heads(None, 2, 4) == [(1, 0)] and parse_heads("1:3, 0:0,1:3", 2, 4) == [(1, 3), (0, 0)]
    with pytest.raises(UserError, match="no head"):
        list(gather(bert, ["a b"], [(5, 0)]))
    with pytest.raises(UserError, match="at least 2"):
        joint_embedding(HeadPoints(0, 0, np.zeros((1, 4), np.float32), np.zeros((1, 4), np.float32),
                                   np.zeros(1, np.int32), np.zeros(1, np.int32), ["a"], np.zeros(1, bool)))
    with pytest.raises(UserError, match="umap-learn|pca or umap"):
        joint_embedding(run_corpus(bert, ["red cat"], [(0, 0)]).points(0, 0), "tsne")


def test_the_file_form_holds_everything(bert, tmp_path):
    c = run_corpus(bert, sentences(5), [(1, 2)])
    a = corpus_arrays(c)
    assert a["stat_entropy"].shape == (5, 2, 4) and a["L1H2_xy"].shape == (2 * len(c.points(1, 2).q), 2)
    assert list(a["sentences"]) == c.sentences and a["heads"].tolist() == [[1, 2]]
