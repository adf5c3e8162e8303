"""Test-wide setup: Qt runs offscreen. Qt fixtures live in tests/gui/conftest.py, so core tests never load Qt."""
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
