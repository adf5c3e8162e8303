"""attn-explorer: see what attention does inside transformers.

    import attn_explorer as ax
    m = ax.load_model("minilm")
    r = m.run("The animal didn't cross the street because it was too tired")
    r.attentions  # (L, H, N, N) float32
    r.tokens      # N strings

Heavy modules (torch) load on first use, so `import attn_explorer` stays cheap for the GUI.
"""
from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "load_model": "attn_explorer.api.load",
    "save_checkpoint": "attn_explorer.api.load",
    "builtin_models": "attn_explorer.api.load",
    "default_image_model": "attn_explorer.api.load",
    "Model": "attn_explorer.api.model",
    "RunResult": "attn_explorer.api.result",
    "ModelInfo": "attn_explorer.api.result",
    "UserError": "attn_explorer.errors",
    "show": "attn_explorer.api.notebook",  # ax.show(result, view="grid") in Jupyter: the page of api/html.py
    # your own analyses, fn(result) -> array: in the window (Analyses -> Yours), `export --analysis NAME`, ax.show
    "register_analysis": "attn_explorer.api.analyses",
    "unregister_analysis": "attn_explorer.api.analyses",
    "analyses": "attn_explorer.api.analyses",
    # ax.open(result_or_path): a saved run in the window ("module:name" where the name differs); Qt loads on use
    "open": "attn_explorer.gui.window.app:open_window",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, _, attr = _LAZY[name].partition(":")
        return getattr(importlib.import_module(module), attr or name)
    raise AttributeError(f"module 'attn_explorer' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))


__all__ = list(_LAZY)
