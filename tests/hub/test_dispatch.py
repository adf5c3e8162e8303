"""A model larger than one device: accelerate places our blocks over the CPU and disk
(`load_model(..., device="auto", max_memory=..., offload_folder=...)`) and the outputs are the
undispatched model's."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("accelerate")
pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from attn_explorer.hub.built import state_bytes  # noqa: E402
from tests.tiny_llama import make_llama_folder  # noqa: E402

TEXT = "The capital of France is Paris. Attention lets every token look back."


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_llama_folder(tmp_path_factory.mktemp("dispatch") / "m", tie_word_embeddings=False,
                             num_hidden_layers=4)


def test_a_model_spread_over_cpu_and_disk_gives_the_undispatched_outputs(folder, tmp_path):
    ref = ax.load_model(str(folder), device="cpu")
    total = state_bytes(ref.module)
    off = tmp_path / "offload"
    m = ax.load_model(str(folder), device="auto", max_memory={"cpu": int(total * 0.6)}, offload_folder=str(off))
    placed = m.module.hf_device_map
    assert set(placed.values()) == {"cpu", "disk"}, placed  # really split between the two
    # Our block class is never split: each placed name is a whole block or something outside the blocks.
    assert not any(k.startswith("blocks.layers.") and k.count(".") > 2 for k in placed), placed
    assert any(off.glob("*.dat"))  # the disk part was written there, not kept in memory
    a, b = ref.run(TEXT, hidden=True), m.run(TEXT, hidden=True)
    np.testing.assert_array_equal(b.attentions, a.attentions)
    np.testing.assert_array_equal(b.hidden, a.hidden)
    assert m.info.device == "cpu"
    ga, gb = ref.generate("The capital of", max_new_tokens=4), m.generate("The capital of", max_new_tokens=4)
    assert [s.token_id for s in gb] == [s.token_id for s in ga]


def test_dispatch_in_bfloat16_offloads_bfloat16(folder, tmp_path):
    ref = ax.load_model(str(folder), device="cpu", dtype="bfloat16")
    total = state_bytes(ref.module, ref.dtype)
    m = ax.load_model(str(folder), device="auto", dtype="bfloat16", max_memory={"cpu": int(total * 0.6)},
                      offload_folder=str(tmp_path / "off"))
    assert "disk" in m.module.hf_device_map.values()
    assert {p.dtype for p in m.module.parameters()} == {ref.dtype}
    np.testing.assert_array_equal(m.run(TEXT).attentions, ref.run(TEXT).attentions)


def test_disk_without_an_offload_folder_is_one_line(folder):
    with pytest.raises(UserError, match="offload_folder") as e:
        ax.load_model(str(folder), device="auto", max_memory={"cpu": 10_000})
    assert "\n" not in str(e.value)


def test_max_memory_needs_device_auto(folder):
    with pytest.raises(UserError, match="device='auto'"):
        ax.load_model(str(folder), device="cpu", max_memory={"cpu": 10_000})
