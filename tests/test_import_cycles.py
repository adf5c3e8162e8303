"""No import cycle between our own modules, counting imports made inside functions too.

import-linter's layers contract sees each floor, but not a cycle inside one floor, and a cycle hidden
in a function body only shows up when that function first runs (a half-initialised module, an
ImportError in a user's hands). Here every module of attn_explorer is parsed with `ast`; every
`import` and `from ... import` anywhere in it (module level or in a function; not under
`if TYPE_CHECKING:`) becomes an edge module -> module; relative imports are resolved, and
`from pkg import name` points at `pkg.name` when that is a module, else at `pkg` (its `__init__`,
a real module with its own imports). Tarjan's algorithm then finds every strongly connected
component of more than one module, and the failure lists each with its edges and line numbers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import attn_explorer

PACKAGE = "attn_explorer"
ROOT = Path(attn_explorer.__file__).resolve().parent


def module_files(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name; a package is named by its `__init__`."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join([package, *parts])] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node in the tree, skipping `if TYPE_CHECKING:` bodies (not their else)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _owner(name: str, modules: dict) -> str | None:
    """The longest prefix of a dotted name that is one of our modules."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph(modules: dict[str, Path] | None = None) -> dict[str, dict[str, list[int]]]:
    """module -> {imported module: [line numbers]} for every import between our own modules."""
    modules = module_files() if modules is None else modules
    graph: dict[str, dict[str, list[int]]] = {name: {} for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _imports(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = package.split(".")
                    if node.level > 1:
                        base = base[: len(base) - (node.level - 1)]
                    base = ".".join(base)
                    source = f"{base}.{node.module}" if node.module else base
                else:
                    source = node.module or ""
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    targets.append(submodule if submodule in modules else source)
            for target in targets:
                owner = _owner(target, modules)
                if owner is not None and owner != name:
                    graph[name].setdefault(owner, []).append(node.lineno)
    return graph


def strongly_connected(graph: dict[str, dict]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), each sorted; only those of size > 1."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def describe(component: list[str], graph: dict[str, dict[str, list[int]]]) -> str:
    members = set(component)
    lines = [f"cycle of {len(component)}: {', '.join(component)}"]
    for source in component:
        for target, linenos in sorted(graph[source].items()):
            if target in members:
                where = ", ".join(str(n) for n in sorted(set(linenos)))
                lines.append(f"    {source} -> {target}  (line {where})")
    return "\n".join(lines)


def test_the_checker_finds_a_cycle_through_a_function_body_and_a_package_init(tmp_path):
    """The scan itself: a cycle made by an import inside a function and by a package's __init__ is found,
    one under TYPE_CHECKING is not."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .b import thing\n")
    (pkg / "b.py").write_text("from pkg import a\n")
    (pkg / "sub" / "__init__.py").write_text("from .c import C\n")
    (pkg / "sub" / "c.py").write_text("from pkg.sub import helper\n")
    (pkg / "sub" / "helper.py").write_text("")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import e\n")
    (pkg / "e.py").write_text("from . import d\n")
    graph = import_graph(module_files(pkg, "pkg"))
    assert strongly_connected(graph) == [["pkg.a", "pkg.b"]]
    # `from pkg.sub import helper` names the submodule, so c -> helper, not c -> pkg.sub: no cycle there
    assert "pkg.sub.helper" in graph["pkg.sub.c"] and "pkg.sub" not in graph["pkg.sub.c"]
    # a name that is not a submodule points at the package's __init__, which imports c: a cycle
    (pkg / "sub" / "c.py").write_text("from pkg.sub import C2\n")
    graph = import_graph(module_files(pkg, "pkg"))
    assert strongly_connected(graph) == [["pkg.a", "pkg.b"], ["pkg.sub", "pkg.sub.c"]]


def test_no_import_cycle_between_our_modules():
    graph = import_graph()
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles between our modules:\n" + "\n".join(describe(c, graph) for c in cycles)
