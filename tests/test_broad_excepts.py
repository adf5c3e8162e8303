"""No broad except that swallows an error silently.

A bare `except:`, `except Exception:` or `except BaseException:` (alone or in a tuple) hides every bug
behind it. Each one in attn_explorer must do one of:
- re-raise (a `raise` in its body),
- show or record the error: its body uses the caught exception (`except Exception as exc:` and then
  `exc` in a message, a label, a log line, a result),
- or say why swallowing is right, on the `except` line: `# noqa: broad-except <reason>` (the project's
  older form `# noqa: BLE001 - <reason>`, ruff's blind-except code, is read the same way); a reason is
  required.
Everything else names the exceptions it expects.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import attn_explorer

ROOT = Path(attn_explorer.__file__).resolve().parent
BROAD = {"Exception", "BaseException"}
REASON = re.compile(r"#\s*noqa:\s*(?:broad-except|BLE001)\b[\s:,\-–—]*(\w.*)?")


def _names(node: ast.expr | None) -> list[str]:
    if node is None:
        return []
    if isinstance(node, ast.Tuple):
        return [n for elt in node.elts for n in _names(elt)]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    return []


def _is_broad(handler: ast.ExceptHandler) -> bool:
    return handler.type is None or any(n in BROAD for n in _names(handler.type))


def _handled(handler: ast.ExceptHandler) -> bool:
    """The body re-raises, or uses the exception it caught."""
    for stmt in handler.body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Raise):
                return True
            if handler.name and isinstance(node, ast.Name) and node.id == handler.name:
                return True
    return False


def _has_reason(lines: list[str], handler: ast.ExceptHandler) -> bool:
    # the comment may sit on any line of a long except clause, up to the colon before the body
    last = handler.body[0].lineno - 1 if handler.body else handler.lineno
    for line in lines[handler.lineno - 1: max(handler.lineno, last)]:
        m = REASON.search(line)
        if m and m.group(1):
            return True
    return False


def swallowing_excepts(source: str) -> list[int]:
    """Line numbers of the broad excepts in `source` that neither re-raise, use the error, nor give a reason."""
    lines = source.splitlines()
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ExceptHandler) and _is_broad(node)
            and not _handled(node) and not _has_reason(lines, node)]


def test_the_scan_tells_a_silent_broad_except_from_an_honest_one():
    src = '''
try:
    f()
except:
    pass
try:
    f()
except (ValueError, Exception):
    x = 1
try:
    f()
except Exception:  # noqa: BLE001
    pass
try:
    f()
except Exception:
    log("failed")
    raise
try:
    f()
except Exception as exc:
    label.setText(str(exc))
try:
    f()
except Exception:  # noqa: broad-except an unknown name from old settings falls back
    pass
try:
    f()
except ValueError:
    pass
'''
    assert swallowing_excepts(src) == [4, 8, 12]  # bare; in a tuple; a noqa without a reason


def test_no_broad_except_swallows_an_error_silently():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for line in swallowing_excepts(path.read_text(encoding="utf-8")):
            found.append(f"{path.relative_to(ROOT.parent)}:{line}")
    assert not found, ("broad excepts that swallow the error: name the exceptions expected, show or re-raise "
                       "the error, or give a reason (# noqa: broad-except <reason>):\n  " + "\n  ".join(found))
