"""hub.load.read_state_dict on old pytorch_model.bin files: a pickle carrying code is refused in plain
words (never "re-run with weights_only=False"), and its code never runs; a .bin of non-tensors is one line."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import attn_explorer as ax
from attn_explorer.errors import UserError
from attn_explorer.hub.load import read_state_dict

RAN: list[str] = []  # what the pickled payload did, if it ever ran


def payload(marker: str) -> str:
    """Stands in for an attacker's code: harmless, but leaves a trace in RAN and on disk."""
    RAN.append(marker)
    Path(marker).write_text("the pickled code ran")
    return os.getcwd()


class Malicious:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return payload, (self.marker,)


def malicious_bin(folder: Path) -> Path:
    folder.mkdir(exist_ok=True)
    marker = folder / "PWNED"
    sd = {"embeddings.word_embeddings.weight": torch.zeros(3, 4), "trap": Malicious(str(marker))}
    torch.save(sd, folder / "pytorch_model.bin")
    return marker


def test_the_trap_is_live_without_weights_only(tmp_path):
    """Control: plain unpickling really runs the payload, so the refusal below is what stops it."""
    marker = malicious_bin(tmp_path / "m")
    with open(tmp_path / "m" / "pytorch_model.bin", "rb") as f:
        assert f.read(2) == b"PK"  # torch's zip format: a real checkpoint, not garbage
    RAN.clear()
    torch.load(tmp_path / "m" / "pytorch_model.bin", weights_only=False)
    assert RAN == [str(marker)] and marker.exists()


def test_pickled_code_is_refused_and_never_runs(tmp_path):
    marker = malicious_bin(tmp_path / "m")
    RAN.clear()
    with pytest.raises(UserError) as e:
        read_state_dict(tmp_path / "m")
    message = str(e.value)
    assert message.startswith("refusing pickled code in ") and "pytorch_model.bin" in message
    assert "convert it to safetensors" in message
    assert "weights_only" not in message and "\n" not in message
    assert RAN == [] and not marker.exists()
    assert type(e.value) is UserError and e.value.__cause__ is None  # no UnpicklingError to show


def test_pickled_code_is_refused_through_load_model(tmp_path):
    """Through the public API, with a real config.json beside it: the same single line."""
    folder = tmp_path / "bert"
    marker = malicious_bin(folder)
    (folder / "config.json").write_text('{"model_type": "bert", "architectures": ["BertModel"], '
                                        '"hidden_size": 4, "num_hidden_layers": 1, "num_attention_heads": 1, '
                                        '"intermediate_size": 8, "vocab_size": 3}')
    RAN.clear()
    with pytest.raises(UserError, match="^refusing pickled code in "):
        ax.load_model(str(folder), device="cpu")
    assert RAN == [] and not marker.exists()


@pytest.mark.parametrize("content, words", [
    ([torch.zeros(2)], "a list"),
    ({"a": 1, "b": "two"}, "'a' is a int"),
    ({"state_dict": {"w": "text"}}, "'w' is a str"),
    (torch.zeros(3), "a Tensor"),
])
def test_a_bin_without_a_state_dict_of_tensors_is_one_line(tmp_path, content, words):
    torch.save(content, tmp_path / "pytorch_model.bin")
    with pytest.raises(UserError) as e:
        read_state_dict(tmp_path)
    message = str(e.value)
    assert "pytorch_model.bin" in message and "not a state dict of tensors" in message and words in message
    assert "\n" not in message


@pytest.mark.parametrize("damage", [lambda b: b[: len(b) // 2], lambda b: b"not a pickle at all " + b[:50]])
def test_a_corrupt_bin_is_one_line(tmp_path, damage):
    torch.save({"w": torch.ones(100)}, tmp_path / "pytorch_model.bin")
    (tmp_path / "pytorch_model.bin").write_bytes(damage((tmp_path / "pytorch_model.bin").read_bytes()))
    with pytest.raises(UserError) as e:
        read_state_dict(tmp_path)
    assert "corrupt or unreadable" in str(e.value) and "\n" not in str(e.value)
    assert "weights_only" not in str(e.value)


def test_a_state_dict_bin_still_loads(tmp_path):
    sd = {"a.weight": torch.ones(2, 3), "a.bias": torch.zeros(2)}
    torch.save({"state_dict": sd}, tmp_path / "pytorch_model.bin")
    got = read_state_dict(tmp_path)
    assert set(got) == set(sd) and torch.equal(got["a.weight"], sd["a.weight"])
