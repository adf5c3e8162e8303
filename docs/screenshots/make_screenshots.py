"""Make every screenshot in docs/screenshots: one per view, and the side panel after an n sweep.

    QT_QPA_PLATFORM=offscreen python docs/screenshots/make_screenshots.py [--only sweep]

The views come from `python main.py --screenshot` (the default text model and the sample sentence;
the overlay and grid-image with resources/samples/coffee.jpg). sweep.png is made here, in process:
the sweep runs in the background exactly as the "Measure n sweep" button starts it, and the window is
grabbed once the last point is in. Settings are throwaway. PNGs over 300 KB are saved with a
256-colour palette to keep the repository small. Run it on an idle machine: timings are shown.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


OUT = ROOT / "docs" / "screenshots"
SAMPLE = ROOT / "resources" / "samples" / "coffee.jpg"
VIEWS = {  # file -> main.py arguments
    "grid.png": ["--view", "grid"],
    "head.png": ["--view", "head"],
    "tokens.png": ["--view", "tokens"],
    "overlay.png": ["--view", "overlay", "--image", str(SAMPLE)],
    "grid-image.png": ["--view", "grid", "--image", str(SAMPLE)],
    "head-1024x700.png": ["--view", "head", "--size", "1024x700"],  # a small screen: everything still legible
}
MAX_BYTES = 300_000


def shrink(png: Path) -> None:
    """Re-save with a 256-colour palette when the file is over MAX_BYTES."""
    if png.stat().st_size <= MAX_BYTES:
        return
    from PIL import Image

    Image.open(png).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(png, optimize=True)


def view_shots() -> None:
    import subprocess

    for name, extra in VIEWS.items():
        subprocess.run([sys.executable, str(ROOT / "main.py"), "--screenshot", str(OUT / name), *extra],
                       check=True, cwd=ROOT)
        shrink(OUT / name)


@contextlib.contextmanager
def live_window(model: str, view: str):
    """A real window (throwaway settings) and a wait(cond) that runs the event loop until cond()."""
    from attn_explorer.gui.window.app import build_window, get_qapp, make_settings

    app = get_qapp()
    args = argparse.Namespace(model=model, text=None, image=None, device="cpu", view=view, screenshot=None)

    def wait(cond, timeout=900.0):
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise TimeoutError
            app.processEvents()
            time.sleep(0.01)

    def settle(seconds=0.5):
        end = time.monotonic() + seconds
        wait(lambda: time.monotonic() > end)

    with tempfile.TemporaryDirectory() as d:
        window, state = build_window(args, settings=make_settings(Path(d) / "settings.ini"))
        window.resize(1480, 1000)
        window.show()
        try:
            yield window, state, wait, settle
        finally:
            window.close()


def sweep_shot(out: Path) -> int:
    """The side panel after the "Measure n sweep" button's background sweep."""
    from attn_explorer.gui.window.export import export_png

    with live_window("minilm", "grid") as (window, state, wait, settle):
        wait(lambda: state.result is not None and not state.busy)
        done = []
        state.sweep_finished.connect(done.append)
        window.seq_panel.sweep_button.click()
        wait(lambda: bool(done))
        settle()
        window.dock.widget().ensureWidgetVisible(window.seq_panel.sweep_readout)  # the whole panel in view
        settle(0.2)
        export_png(window, out)
        print(f"saved {out}: {window.seq_panel.sweep_readout.text()}")
    shrink(out)
    return 0 if done == [True] else 2


def cost_shot(out: Path) -> int:
    """The Cost page after a measured sweep of every variant, n = 64 ... 4096."""
    from attn_explorer.gui.window.export import export_png

    with live_window("textbook", "cost") as (window, state, wait, settle):
        page = window.pages["cost"]
        done = []
        page.sweep_finished.connect(done.append)
        page.run_sweep([64, 128, 256, 512, 1024, 2048, 4096])
        wait(lambda: bool(done))
        settle()
        export_png(window, out)
        print(f"saved {out}: {done}")
    shrink(out)
    return 0 if done == ["done"] else 2


def main() -> int:
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    code = 0
    if only in (None, "views"):
        view_shots()
    if only in (None, "sweep"):
        code |= sweep_shot(OUT / "sweep.png")
    if only in (None, "cost"):
        code |= cost_shot(OUT / "cost.png")
    return code


if __name__ == "__main__":
    sys.exit(main())
