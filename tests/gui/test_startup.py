"""The window is built and painted before torch is imported: the model package loads in the worker."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import argparse, sys, threading
from attn_explorer.gui.window.app import build_window, get_qapp, make_settings
import attn_explorer.session.jobs as jobs
jobs.configure_torch = lambda *a: None  # the load job's own torch import is not the window's
app = get_qapp()
release = threading.Event()
def loader(*a, **k):  # a load that waits: whatever imports torch now is the window itself
    release.wait(20)
    raise RuntimeError("never loaded")
args = argparse.Namespace(model="minilm", text=None, image=None, device="cpu", view=None)
window, state = build_window(args, settings=make_settings(sys.argv[1]), loader=loader)
window.show()
for _ in range(20):
    app.processEvents()
print("torch" in sys.modules)
release.set()
state.shutdown()
"""


def test_building_and_showing_the_window_does_not_import_torch(tmp_path):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "s.ini")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "False", proc.stdout
