"""session.atlas: the corpus it reads, the build with progress, save and open, the picture, the second model's
atlas and the same prompt's maps, on the planted tiny GPT-2 (tests/analysis/atlas_planted)."""
from __future__ import annotations

import numpy as np
import pytest

from attn_explorer.errors import UserError
from attn_explorer.session import atlas as sa
from tests.analysis.atlas_planted import make_planted_folder, repeated_documents


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    import attn_explorer as ax

    folder = make_planted_folder(tmp_path_factory.mktemp("planted"))
    return str(folder), ax.load_model(str(folder), device="cpu")


def docs(n=4):
    texts = repeated_documents(n, half=12)
    return sa.Documents(texts, [f"d{i}.txt" for i in range(n)], "test")


def test_read_documents_files_folder_lines_and_bad_input(tmp_path):
    (tmp_path / "a.txt").write_text("one two\n\nthree\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("four\n", encoding="utf-8")
    d = sa.read_documents([tmp_path])
    assert d.names == ["a.txt", "b.txt"] and d.source == f"folder {tmp_path.name}/"
    d = sa.read_documents([tmp_path / "a.txt"], per_line=True)
    assert d.texts == ["one two", "three"] and d.names == ["a.txt:1", "a.txt:3"]
    with pytest.raises(UserError, match="not found"):
        sa.read_documents([tmp_path / "missing.txt"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no .txt files"):
        sa.read_documents([tmp_path / "empty"])


def test_the_build_reports_progress_and_names_its_sources(planted):
    _, m = planted
    seen = []
    a = sa.atlas_job(m, docs(), sa.TOP_K, None, progress=lambda f, msg: seen.append((f, msg)))
    assert a.n_layers == 2 and a.n_heads == 2 and set(a.metrics) >= set(sa.METRICS)
    assert seen and seen[-1][0] == pytest.approx(1.0) and "tokens" in seen[-1][1]
    assert [f for f, _ in seen] == sorted(f for f, _ in seen)
    ex = a.head_examples(0, 0, "weight")[0]
    assert a.sources[ex.doc].startswith("d") and ex.tokens[ex.query_at] == m.run(a.texts[ex.doc]).tokens[ex.query]


def test_a_quit_progress_ends_the_build():
    class Quit(Exception):
        pass

    def progress(*_):
        raise Quit  # what the worker's progress callback does after cancel (workers.Cancelled)

    import attn_explorer as ax

    m = ax.load_model("minilm", device="cpu")
    with pytest.raises(Quit):
        sa.atlas_job(m, sa.Documents(["the cat sat on the mat"] * 3, ["a", "b", "c"], "t"), 2, None, progress)


def test_save_open_round_trip_and_the_picture(planted, tmp_path):
    _, m = planted
    a = sa.atlas_job(m, docs(), sa.TOP_K, None)
    path = sa.save_atlas_job(a, str(tmp_path / "atlas"))
    assert path.endswith("atlas.npz")
    b = sa.load_atlas_job(path)
    assert b.model == a.model and b.texts == a.texts
    for k in a.metrics:
        np.testing.assert_array_equal(a.metrics[k], b.metrics[k])
    p = sa.project_job(b, "pca")
    assert p.xy.shape == (4, 2) and np.all(np.isfinite(p.xy)) and p.explained[0] >= p.explained[1]
    assert sum(p.explained) <= 1 + 1e-9
    with pytest.raises(UserError, match="pca or umap"):
        sa.project_job(b, "tsne")
    with pytest.raises(UserError, match="not a readable|no atlas"):
        sa.load_atlas_job(str(tmp_path / "nothing.npz"))


def test_the_second_model_is_loaded_in_its_job_and_kept_for_the_prompt(planted):
    folder, m = planted
    from tests.gui.conftest import cached_loader

    holder = sa.SecondModel()
    b = sa.second_atlas_job(holder, cached_loader, folder, "cpu", docs(), sa.TOP_K, None)
    assert holder.model is not None and holder.src == folder
    pairs = sa.match_job(b, b)
    assert [(p[0], p[1]) for p in pairs if p[:2] == p[2:4]] and all(p[4] == pytest.approx(1.0) for p in pairs)
    one = sa.prompt_map_job(m, "alpha bravo alpha bravo", 1, 0)
    two = sa.second_prompt_map_job(holder, "alpha bravo alpha bravo", 1, 0)
    assert one.tokens == two.tokens == ["alpha", "bravo", "alpha", "bravo"]
    np.testing.assert_allclose(one.weights, two.weights)
    with pytest.raises(UserError, match="not loaded"):
        sa.second_prompt_map_job(sa.SecondModel(), "alpha", 0, 0)
    with pytest.raises(UserError, match="not a head"):
        sa.prompt_map_job(m, "alpha bravo", 5, 0)
