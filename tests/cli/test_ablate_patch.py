"""`ablate` and `patch` on the command line, with a tiny random Llama folder and MiniLM."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.analysis import interventions as iv  # noqa: E402
from tests.cli.conftest import assert_one_error_line, files_under  # noqa: E402
from tests.tiny_llama import make_llama_folder  # noqa: E402

TEXT = "The capital of France is Paris. The capital of Italy is"
CLEAN, CORRUPT = "The capital of France is", "The capital of Italy is"  # 8 tokens each


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_llama_folder(tmp_path_factory.mktemp("llama"))


def test_ablate_writes_the_grid_as_json_and_npz(cli, folder, tmp_path):
    out = tmp_path / "scan.json"
    code, stdout, err = cli("ablate", "--model", folder, "--text", TEXT, "--target", " capital", "--out", out,
                            "--device", "cpu", "--batch", "5")
    assert code == 0, err
    d = json.loads(out.read_text())
    m = ax.load_model(str(folder), device="cpu")
    ref = iv.ablation_scan(m, TEXT, target=" capital")
    assert np.allclose(d["values"], ref.values, atol=1e-5) and d["passes"] == 3  # 12 heads, 5 a pass
    assert d["metric"] == "log p(' capital')" and d["model"] == str(folder)
    best = ref.ranked(1)[0]
    assert f"L{best[0]} H{best[1]}:" in stdout.splitlines()[2]  # the largest effect is printed first
    npz = tmp_path / "scan.npz"
    code, _, err = cli("ablate", "--model", folder, "--text", TEXT, "--how", "mean", "--out", npz, "--device", "cpu")
    assert code == 0, err
    z = np.load(npz)
    assert z["values"].shape == (2, 6) and str(z["how"]) == "mean" and list(z["tokens"]) == ref.tokens


def test_ablate_an_encoder_measures_the_embedding_similarity(cli, tmp_path):
    out = tmp_path / "minilm.json"
    code, _, err = cli("ablate", "--model", "minilm", "--text", "The animal didn't cross the street.", "--out", out,
                       "--device", "cpu")
    assert code == 0, err
    d = json.loads(out.read_text())
    assert d["metric"].startswith("cosine") and d["clean"] == pytest.approx(1.0, abs=1e-6)
    assert np.asarray(d["values"]).shape == (6, 12) and np.max(d["values"]) <= 1 + 1e-6


def test_patch_per_head_per_position_and_given_heads(cli, folder, tmp_path):
    out = tmp_path / "patch.npz"
    code, stdout, err = cli("patch", "--model", folder, "--clean", CLEAN, "--corrupt", CORRUPT, "--target", " capital",
                            "--foil", " of", "--out", out, "--device", "cpu")
    assert code == 0, err
    z = np.load(out)
    assert z["values"].shape == (2, 6) and str(z["kind"]) == "patch-head"
    assert "corrupt" in stdout.splitlines()[0]
    pos = tmp_path / "pos.json"
    code, _, err = cli("patch", "--model", folder, "--clean", CLEAN, "--corrupt", CORRUPT, "--target", " capital",
                       "--per", "position", "--out", pos, "--device", "cpu")
    assert code == 0, err
    d = json.loads(pos.read_text())
    assert np.asarray(d["values"]).shape == (2, 8) and len(d["tokens"]) == 8
    given = tmp_path / "given.json"
    every = ",".join(f"{l}:{h}" for l in range(2) for h in range(6))
    code, stdout, err = cli("patch", "--model", folder, "--clean", CLEAN, "--corrupt", CORRUPT, "--target",
                            " capital", "--heads", every, "--out", given, "--device", "cpu")
    assert code == 0, err
    g = json.loads(given.read_text())
    assert g["patched"] == pytest.approx(g["clean"], abs=1e-6)  # every head from the clean run: the clean output
    assert "100.0% of the gap restored" in stdout


@pytest.mark.parametrize("argv,words", [
    (("ablate", "--text", TEXT, "--target", " Romeward", "--out", "{tmp}/a.json"), ("not one",)),
    (("patch", "--clean", "The capital", "--corrupt", CORRUPT, "--target", " capital", "--out", "{tmp}/p.json"),
     ("same number of tokens",)),
    (("patch", "--clean", CLEAN, "--corrupt", CORRUPT, "--heads", "2:0", "--out", "{tmp}/p.json"), ("no head L2 H0",)),
    (("patch", "--clean", CLEAN, "--corrupt", CORRUPT, "--heads", "x", "--out", "{tmp}/p.json"), ("layer:head",)),
    (("patch", "--clean", CLEAN, "--corrupt", CORRUPT, "--heads", "0:1", "--out", "{tmp}/p.npz"), (".json",)),
    (("ablate", "--text", TEXT, "--out", "{tmp}/a.csv"), (".json", ".npz")),
    (("ablate", "--text", TEXT, "--out", "{tmp}/missing/a.json"), ("does not exist",)),
    (("ablate", "--text", TEXT, "--batch", "0", "--out", "{tmp}/a.json"), ("--batch",)),
])
def test_bad_input_is_one_line_and_writes_nothing(cli, folder, tmp_path, argv, words):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    before = files_under(tmp_path)
    code, _, err = cli(*argv[:1], "--model", folder, *argv[1:], "--device", "cpu")
    assert_one_error_line(code, err, *words)
    assert files_under(tmp_path) == before
