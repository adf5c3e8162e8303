"""The house keeps Model's forward private to api/model.py: every other module (api.vlm's vision-language runs,
api.prefix, the analyses) goes through the public Model.trace or Model.traced_run, which apply hooks in one order
(ablation, the open `with m.hooks()` blocks, the call's hooks, caching). And api/model.py stays under 450 lines."""
from __future__ import annotations

import ast
from pathlib import Path

import attn_explorer

ROOT = Path(attn_explorer.__file__).parent


def private_forward_calls() -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path == ROOT / "api" / "model.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "_forward":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_private_model_forward_outside_api_model():
    assert private_forward_calls() == []


def test_api_model_stays_under_450_lines():
    assert len((ROOT / "api" / "model.py").read_text(encoding="utf-8").splitlines()) <= 450
