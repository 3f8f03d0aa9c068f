"""No import cycles among runner/, ops/ and kernels/ (issue 12).

The graph is read from the source with :mod:`ast`: every ``import`` and ``from ... import``
of these packages, at module level and inside functions (a lazy import is still a cycle
waiting to happen), skipping ``if TYPE_CHECKING:`` blocks. A package's ``__init__`` counts as
the package. Dynamic imports (``importlib.import_module`` of an op's implementations) are not
edges: the op list (ops.OPS) is data.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runner", "ops", "kernels")

KNOWN_CYCLES: dict[frozenset[str], str] = {}
"""Cycles left, each with its reason; the list may only shrink (none left)."""


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in PACKAGES and "build" not in rel.parts:
            name = ".".join(rel.with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(path: Path, known: dict[str, Path]) -> set[str]:
    out: set[str] = set()
    stack: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"))]
    while stack:
        node = stack.pop()
        if _type_checking(node):
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
        stack.extend(ast.iter_child_nodes(node))
    return {m for m in out if m in known}


def cycles() -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    known = _modules()
    graph = {m: _imports(p, known) - {m} for m, p in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_new_import_cycles():
    new = [sorted(c) for c in cycles() if c not in KNOWN_CYCLES]
    assert not new, new


def test_known_cycles_still_exist():
    """A cycle that is gone leaves KNOWN_CYCLES (the list only shrinks)."""
    assert set(KNOWN_CYCLES) <= set(cycles())
