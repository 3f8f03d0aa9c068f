"""The package's shape: no function over 80 lines but the kernel factories, and a runner
whose top level stays small (its stages are packages).

A kernel factory is one closure over the layout and dtype in which numba.cuda device
functions and kernels are defined and call each other: splitting it would pass those
functions around as arguments. Every other function is read from its source with :mod:`ast`
(decorators and docstring included in its length).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gate_residual_matrix"
MAX_LINES = 80
MAX_RUNNER_MODULES = 15

KERNEL_FACTORIES: dict[tuple[str, str], str] = {
    ("kernels/gate_residual_vec.py", "make_vec_kernels"):
        "the vectorised forward and backward kernels closing over one dtype's lane codecs",
    ("kernels/rms_norm_forward.py", "_build"):
        "the RMSNorm forward kernels closing over one layout, dtype and math variant",
    ("kernels/rms_norm_backward.py", "_build"):
        "the RMSNorm backward kernels closing over one layout and dtype",
    ("kernels/rms_norm_rows.py", "make_row_functions"):
        "the row device functions (fetch, emit, sums) the RMSNorm kernels share, per layout",
}
"""Functions allowed over :data:`MAX_LINES`: (path under the package, name) -> why."""


def long_functions(root: Path = PACKAGE, limit: int = MAX_LINES) -> dict[tuple[str, str], int]:
    """(path under ``root``, function name) -> its lines, for every function over ``limit``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = node.end_lineno - start + 1
                if lines > limit:
                    found[(rel, node.name)] = lines
    return found


def test_no_long_functions_but_kernel_factories():
    too_long = {k: v for k, v in long_functions().items() if k not in KERNEL_FACTORIES}
    assert not too_long, f"functions over {MAX_LINES} lines (split them): {too_long}"


def test_kernel_factories_are_kernels_and_still_long():
    found = long_functions()
    for rel, name in KERNEL_FACTORIES:
        assert rel.startswith("kernels/"), rel
        assert (rel, name) in found, f"{rel} {name} is {MAX_LINES} lines or fewer: drop it"


def test_long_function_check_finds_what_it_looks_for(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "m.py").write_text(f"def short():\n    pass\n\n\ndef long():\n{body}\n")
    assert long_functions(tmp_path) == {("m.py", "long"): MAX_LINES + 1}


def runner_modules() -> list[str]:
    """The modules at the runner's top level: its ``.py`` files (but ``__init__`` and
    ``__main__``) and its packages."""
    runner = PACKAGE / "runner"
    files = [p.stem for p in runner.glob("*.py") if p.stem not in ("__init__", "__main__")]
    packages = [p.name for p in runner.iterdir() if (p / "__init__.py").is_file()]
    return sorted(files + packages)


def test_runner_top_level_is_small():
    found = runner_modules()
    assert len(found) <= MAX_RUNNER_MODULES, (
        f"runner/ has {len(found)} top-level modules (at most {MAX_RUNNER_MODULES}: move some "
        f"into a stage package): {', '.join(found)}")
