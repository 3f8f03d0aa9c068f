"""kernels/ is a library the runner calls: it imports nothing from ``runner`` and
its modules form no import cycle. Read from the source (every ``import`` statement, those under
``if SIMULATOR`` and inside functions included), so no branch hides an edge."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "gate_residual_matrix" / "kernels"


def imports_of(path: Path) -> set[str]:
    """Top-level package modules named by every import in ``path``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def kernel_graph() -> dict[str, set[str]]:
    modules = {f"gate_residual_matrix.kernels.{p.stem}": p for p in KERNELS.glob("*.py")
               if p.stem != "__init__"}
    return {m: {n for n in imports_of(p) if n in modules and n != m} for m, p in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return [*stack[stack.index(n):], n]
            if n not in state and (cycle := visit(n)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_kernels_modules_form_no_import_cycle():
    graph = kernel_graph()
    assert "gate_residual_matrix.kernels.rounding" in graph
    assert "gate_residual_matrix.kernels.indexed_scale_shift" in graph
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_kernels_import_nothing_from_the_runner():
    found = {p.name: sorted(n for n in imports_of(p) if n.startswith("gate_residual_matrix.runner"))
             for p in KERNELS.glob("*.py")}
    assert not {k: v for k, v in found.items() if v}


def test_kernels_load_without_the_runner():
    """Importing every op module (GPU and CPU) loads no runner module."""
    code = ("import sys, gate_residual_matrix.kernels.gate_residual_cpu, "
            "gate_residual_matrix.kernels.indexed_scale_shift_cpu; "
            "print(sorted(m for m in sys.modules if m.startswith('gate_residual_matrix.runner')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
