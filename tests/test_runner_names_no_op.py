"""``runner/`` names no op: an op's name, tensor names, labels and sizes live in
``ops/<op>/``; the runner reads them from the op's spec or from the report.

The check reads the code, not the prose: every string constant that is not a docstring,
every attribute name and every identifier of each module under ``runner/``, parsed with
:mod:`ast`. Docstrings and comments may use an op as an example. The words come from the
specs themselves (:data:`ops.OPS`), so a new op is covered by the one line that lists it.
"""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

from gate_residual_matrix import ops

RUNNER = Path(__file__).resolve().parents[1] / "gate_residual_matrix" / "runner"

EXEMPT: dict[str, str] = {}
"""Modules not yet op-free, each with the reason; the list may only shrink."""


def _words() -> tuple[re.Pattern[str], set[str]]:
    names = "|".join(map(re.escape, ops.OPS))
    op_name = re.compile(rf"(?<![\w-])({names})(?![\w-])")
    exact: set[str] = set()
    layout: set[str] = set()  # the reference layout's words, every op's: out, index, grad_out
    for op in ops.OPS:
        spec = ops.get(op)
        exact |= {*spec.inputs, *spec.sizes, *spec.labels().values(), *spec.grads}
        layout |= {spec.forward, spec.labels()[spec.forward], spec.index, spec.upstream}
    return op_name, exact - layout


def _sizes() -> set[str]:
    return {s for op in ops.OPS for s in ops.get(op).sizes}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    # an attribute docstring (a string statement right after an assignment) is prose too
    for node in ast.walk(tree):
        for body in (getattr(node, "body", None), getattr(node, "orelse", None)):
            if isinstance(body, list):
                for prev, stmt in itertools.pairwise(body):
                    if (isinstance(prev, (ast.Assign, ast.AnnAssign)) and isinstance(stmt, ast.Expr)
                            and isinstance(stmt.value, ast.Constant)):
                        found.add(id(stmt.value))
    return found


def offences(path: Path) -> list[str]:
    """``line: what`` for every op-specific name in the code of ``path``."""
    op_name, exact = _words()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prose = _docstrings(tree)
    formatted = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            if op_name.search(node.value):
                out.append(f"{node.lineno}: op name in {node.value[:60]!r}")
            elif node.value in exact and id(node) not in formatted:  # f"{x:.2f}x" is no tensor
                out.append(f"{node.lineno}: tensor, label or size {node.value!r}")
        elif isinstance(node, ast.Attribute) and node.attr in _sizes():
            out.append(f"{node.lineno}: attribute .{node.attr}")
        elif isinstance(node, ast.Name) and op_name.fullmatch(node.id):
            out.append(f"{node.lineno}: name {node.id}")
    return out


def test_runner_code_names_no_op():
    found = {}
    for path in sorted(RUNNER.rglob("*.py")):
        rel = path.relative_to(RUNNER).as_posix()
        if rel in EXEMPT:
            continue
        if hits := offences(path):
            found[rel] = hits
    assert not found, found


def test_the_check_finds_what_it_looks_for(tmp_path):
    """A module that names an op's tensor, size or name is caught (the test can fail)."""
    bad = tmp_path / "bad.py"
    bad.write_text('"""Docstring naming gate_residual and "gate" is fine."""\n'
                   'x = {"gate": 1}\nn = problem.D\nop = "indexed_scale_shift"\n'
                   'ok = "gate_residual_matrix"\n', encoding="utf-8")
    assert sorted(h.split(":")[0] for h in offences(bad)) == ["2", "3", "4"]


def test_exemptions_exist():
    assert all((RUNNER / rel).exists() for rel in EXEMPT), "drop exemptions of gone modules"
