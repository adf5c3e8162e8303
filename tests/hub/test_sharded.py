"""Checkpoints of any size: shards read through their index (safetensors and old .bin), straight into the
target dtype; a file the index does not name is ignored, a missing one is one line; the module is built on
the meta device, so nothing patches torch.nn.init for other threads while a model loads."""
from __future__ import annotations

import dataclasses
import json
import shutil
import threading

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn_explorer as ax  # noqa: E402
from attn_explorer.errors import UserError  # noqa: E402
from attn_explorer.hub import families, shards  # noqa: E402
from tests.tiny_llama import make_llama_folder  # noqa: E402


def _resave(src, dst, safe: bool, shard: str = "20KB"):
    """src's transformers model saved again in shards of about `shard` each: by save_pretrained as
    safetensors, or as old pytorch_model-0000i-of-0000n.bin files with their index (transformers 5 no
    longer writes .bin), the layout transformers 4 wrote."""
    model = transformers.AutoModelForCausalLM.from_pretrained(src, attn_implementation="eager")
    if safe:
        model.save_pretrained(dst, safe_serialization=True, max_shard_size=shard)
    else:
        model.config.save_pretrained(dst)
        sd = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight" or
              not model.config.tie_word_embeddings}
        keys = sorted(sd)
        n = 4
        weight_map = {}
        for i in range(n):
            name = f"pytorch_model-{i + 1:05d}-of-{n:05d}.bin"
            part = {k: sd[k] for k in keys[i::n]}
            torch.save(part, dst / name)
            weight_map.update({k: name for k in part})
        (dst / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, dst / f)
    return dst


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("sharded")
    one = make_llama_folder(base / "one", tie_word_embeddings=False)
    return {"one": one, "st": _resave(one, base / "st", True), "bin": _resave(one, base / "bin", False)}


def _states_equal(a, b):
    sa, sb = a.module.state_dict(), b.module.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("kind,index", [("st", "model.safetensors.index.json"), ("bin", "pytorch_model.bin.index.json")])
def test_sharded_checkpoints_load_through_their_index(folders, kind, index):
    folder = folders[kind]
    names = set(json.loads((folder / index).read_text())["weight_map"].values())
    assert len(names) >= 4  # really sharded
    m = ax.load_model(str(folder), device="cpu")
    _states_equal(m, ax.load_model(str(folders["one"]), device="cpu"))
    r = m.run("The capital of France is")
    assert r.attentions.shape[0] == 2


def test_a_file_the_index_does_not_name_is_ignored(folders, tmp_path):
    folder = shutil.copytree(folders["st"], tmp_path / "m")
    from safetensors.torch import save_file

    save_file({"stray.weight": torch.ones(3)}, str(folder / "model-old-copy.safetensors"))
    m = ax.load_model(str(folder), device="cpu")  # merged in, the stray tensor was 'unexpected'
    _states_equal(m, ax.load_model(str(folders["one"]), device="cpu"))


@pytest.mark.parametrize("kind,index", [("st", "model.safetensors.index.json"), ("bin", "pytorch_model.bin.index.json")])
def test_a_shard_the_index_names_but_is_missing_is_one_line(folders, tmp_path, kind, index):
    folder = shutil.copytree(folders[kind], tmp_path / "m")
    gone = sorted(set(json.loads((folder / index).read_text())["weight_map"].values()))[1]
    (folder / gone).unlink()
    with pytest.raises(UserError) as e:
        ax.load_model(str(folder), device="cpu")
    msg = str(e.value)
    assert gone in msg and index in msg and "\n" not in msg


def test_an_unreadable_index_is_one_line(folders, tmp_path):
    folder = shutil.copytree(folders["st"], tmp_path / "m")
    (folder / "model.safetensors.index.json").write_text('{"weight_map": 3}')
    with pytest.raises(UserError, match="not a readable weights index") as e:
        ax.load_model(str(folder), device="cpu")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_shards_are_read_straight_into_the_dtype(folders, dtype):
    """Every tensor arrives in the asked dtype, equal to the float32 weights cast, on the CPU too."""
    m = ax.load_model(str(folders["st"]), device="cpu", dtype=dtype)
    want = getattr(torch, dtype)
    assert m.dtype == want and m.info.dtype == dtype
    ref = ax.load_model(str(folders["one"]), device="cpu").module.state_dict()
    for k, t in m.module.state_dict().items():
        assert t.dtype == want and torch.equal(t, ref[k].to(want)), k


def test_each_shard_is_read_once_and_one_at_a_time(folders, monkeypatch):
    """The loader reads shard after shard: each file once, never the whole folder into one dict first."""
    opened: list[str] = []
    real = shards.Checkpoint.read_file

    def spy(self, f, names):
        opened.append(f.name)
        return real(self, f, names)

    monkeypatch.setattr(shards.Checkpoint, "read_file", spy)
    ax.load_model(str(folders["st"]), device="cpu")
    names = json.loads((folders["st"] / "model.safetensors.index.json").read_text())["weight_map"].values()
    assert sorted(opened) == sorted(set(names))


def test_a_seeded_module_built_in_another_thread_during_a_load_keeps_its_seed(folders, monkeypatch):
    """A load used to turn torch.nn.init off process-wide while it built its module (hub.built.skip_init):
    an nn.Linear built then in another thread kept torch.empty's garbage. The meta device is thread-local."""
    def seeded():
        torch.manual_seed(7)
        return torch.nn.Linear(64, 64).weight.detach().clone()

    want = seeded()
    got = {}
    arch = families.ARCHITECTURES["llama"]

    def build_while_another_thread_builds(cfg):
        module = arch.build(cfg)
        t = threading.Thread(target=lambda: got.setdefault("w", seeded()))
        t.start()
        t.join(30)  # built while this load is inside its build step
        return module

    monkeypatch.setitem(families.ARCHITECTURES, "llama",
                        dataclasses.replace(arch, build=build_while_another_thread_builds))
    ax.load_model(str(folders["one"]), device="cpu")
    assert torch.equal(got["w"], want)


def test_a_model_too_large_for_the_free_memory_is_refused_saying_need_and_free(folders, monkeypatch):
    from attn_explorer.hub import built

    monkeypatch.setattr(built, "available_bytes", lambda device="cpu": 100_000)
    with pytest.raises(UserError) as e:
        ax.load_model(str(folders["st"]), device="cpu", dtype="bfloat16")
    msg = str(e.value)
    assert "would need" in msg and "bfloat16" in msg and "100 kB is free on cpu" in msg and "\n" not in msg
