"""Tests that open attn-explorer's HTML page in a real headless browser (Debian's chromium, driven by Playwright)."""
