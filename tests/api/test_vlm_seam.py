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


def test_run_and_trace_meet_hooks_in_one_order(tmp_path):
    """A hook of an open `with m.hooks()` block on hook_z sees the head already switched off, whether the forward is
    run(ablate=...), run_with_cache or trace(ablate=...), and a cache of hook_z keeps the same."""
    import attn_explorer as ax
    from tests.tiny_llama import make_llama_folder

    m = ax.load_model(str(make_llama_folder(tmp_path / "llama", num_hidden_layers=2)), device="cpu")
    seen = []

    def record(z, _name):
        seen.append(z[0, :, 1].abs().max().item())

    text, off = "the cat sat on the mat", {(0, 1): "zero"}
    with m.hooks({"blocks.0.attn.hook_z": record}):
        m.run(text, ablate=off)
        _, cache = m.run_with_cache(text, names=["blocks.0.attn.hook_z"], ablate=off)
        t = m.trace(m.prepare(text), names=["blocks.0.attn.hook_z"], ablate=off)
        m.run(text)
    assert seen[:3] == [0.0, 0.0, 0.0] and seen[3] > 0
    assert cache["blocks.0.attn.hook_z"][0, :, 1].abs().max() == 0 == t.cache["blocks.0.attn.hook_z"][0, :, 1].abs().max()
