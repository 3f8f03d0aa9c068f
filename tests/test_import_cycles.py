"""No import cycles in the package, the op contract below the runner, and the tables' layers.

The graph is read from the source with :mod:`ast`: every ``import`` and ``from ... import``
of these packages, at module level and inside functions (a lazy import is still a cycle
waiting to happen), skipping ``if TYPE_CHECKING:`` blocks. A package's ``__init__`` counts as
the package. Dynamic imports (``importlib.import_module`` of an op's implementations) are not
edges: the op list (ops.OPS) is data, and the layers below make such an edge harmless anyway:
``ops/`` and ``contract/`` never import ``runner/``, so the runner's dynamic import of an op's
implementations cannot close a loop.

The tables (``runner/tables/``) are layered: the model never imports a renderer or the
writer, a renderer imports the model and its own format's modules only (and ``links``, the
page names the Markdown and the HTML share), and the rest of the runner imports the package's
entry points (``runner.tables``), not its modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gate_residual_matrix",)

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


def graph() -> dict[str, set[str]]:
    """Module -> the modules of these packages it imports."""
    known = _modules()
    return {m: _imports(p, known) - {m} for m, p in known.items()}


def cycles() -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph_ = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph_[v]:
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

    for v in sorted(graph_):
        if v not in index:
            visit(v)
    return found


def test_no_new_import_cycles():
    new = [sorted(c) for c in cycles() if c not in KNOWN_CYCLES]
    assert not new, new


def test_known_cycles_still_exist():
    """A cycle that is gone leaves KNOWN_CYCLES (the list only shrinks)."""
    assert set(KNOWN_CYCLES) <= set(cycles())


TABLES = "gate_residual_matrix.runner.tables"
RENDER = f"{TABLES}.render"
FORMATS = {"markdown": "markdown", "pages": "markdown", "answers": "markdown", "html": "html",
           "answers_html": "html", "summary": "summary", "plots": "plots"}
"""Each renderer's format: a renderer may import the modules of its own format."""
SHARED_RENDER = {f"{RENDER}.links"}
"""Renderer modules every format may import."""


def layer_violations(edges: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` for every import that crosses the tables' layers wrongly."""
    out = []
    for module, imported in sorted(edges.items()):
        for target in sorted(imported):
            if not target.startswith(TABLES):
                continue
            inside = module == TABLES or module.startswith(TABLES + ".")
            if not inside:
                bad = target != TABLES  # outside code uses the entry points only
            elif module.startswith(f"{TABLES}.model"):
                bad = not target.startswith(f"{TABLES}.model")
            elif module.startswith(RENDER + "."):
                own = FORMATS.get(module.rsplit(".", 1)[1])
                bad = target == TABLES or target == f"{TABLES}.write" or (
                    target.startswith(RENDER + ".") and target not in SHARED_RENDER
                    and (own is None or FORMATS.get(target.rsplit(".", 1)[1]) != own))
            else:
                bad = False  # the package and its writer put the layers together
            if bad:
                out.append(f"{module} -> {target}")
    return out


def test_tables_are_covered():
    """The graph holds the tables' modules, both layers (the checks above see them)."""
    found = set(graph())
    assert {TABLES, f"{TABLES}.write", f"{TABLES}.model.build", f"{TABLES}.model.cells",
            f"{RENDER}.markdown", f"{RENDER}.html", f"{RENDER}.summary",
            f"{RENDER}.plots"} <= found
    assert not [sorted(c) for c in cycles() if any(m.startswith(TABLES) for m in c)]


def test_tables_layers():
    assert layer_violations(graph()) == []


def test_layer_check_finds_what_it_looks_for():
    """A model importing a renderer, a renderer importing another format or the writer, and
    outside code importing a module of the package are caught; allowed imports are not."""
    edges = {
        f"{TABLES}.model.bits": {f"{RENDER}.html", f"{TABLES}.model.cells"},
        f"{RENDER}.html": {f"{RENDER}.pages", f"{RENDER}.links", f"{TABLES}.model.build"},
        f"{RENDER}.pages": {f"{RENDER}.markdown", f"{TABLES}.write"},
        "gate_residual_matrix.runner.run": {TABLES, f"{TABLES}.model.filters"},
        f"{TABLES}.write": {f"{RENDER}.html", f"{TABLES}.model.build"},
    }
    assert layer_violations(edges) == [
        f"gate_residual_matrix.runner.run -> {TABLES}.model.filters",
        f"{TABLES}.model.bits -> {RENDER}.html",
        f"{RENDER}.html -> {RENDER}.pages",
        f"{RENDER}.pages -> {TABLES}.write",
    ]


PKG = "gate_residual_matrix"
LAYERS = {
    f"{PKG}.settings": (PKG,),
    f"{PKG}.kernels": (f"{PKG}.contract", f"{PKG}.ops", f"{PKG}.runner", f"{PKG}.bench"),
    f"{PKG}.contract": (f"{PKG}.ops", f"{PKG}.runner", f"{PKG}.bench"),
    f"{PKG}.ops": (f"{PKG}.runner", f"{PKG}.bench"),
    f"{PKG}.runner": (f"{PKG}.bench",),
}
"""Each package and the packages above it, which it must never import. ``settings`` (every
environment variable) sits below them all: every layer, the kernels included, may import it,
and it imports nothing of the package. The benchmark sits on top: it reads the runner's
matrices and rows; the runner never imports it."""


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` for every import from a lower package into a higher one."""
    out = []
    for module, imported in sorted(edges.items()):
        for low, above in LAYERS.items():
            if module == low or module.startswith(low + "."):
                out += [f"{module} -> {t}" for t in sorted(imported)
                        if any(t == a or t.startswith(a + ".") for a in above)]
    return out


def test_op_contract_is_below_the_runner():
    """No module of ops/, contract/ or kernels/ imports the runner (or, for the lower two,
    an op): an op author needs the contract, never the runner. Nothing below the benchmark
    imports it; settings imports nothing of the package."""
    assert upward_imports(graph()) == []


def test_upward_import_check_finds_what_it_looks_for():
    edges = {f"{PKG}.ops.rms_norm.eager": {f"{PKG}.contract.base", f"{PKG}.runner.errors"},
             f"{PKG}.contract.inputs": {f"{PKG}.ops"},
             f"{PKG}.runner.cell.run": {f"{PKG}.ops", f"{PKG}.contract.base"},
             f"{PKG}.runner.tables.render.plots": {f"{PKG}.bench.run"},
             f"{PKG}.bench.run": {f"{PKG}.runner.cell.catalog", f"{PKG}.contract.inputs"},
             f"{PKG}.kernels.launch": {f"{PKG}.settings"},
             f"{PKG}.settings": {f"{PKG}.kernels.errors", PKG}}
    assert upward_imports(edges) == [f"{PKG}.contract.inputs -> {PKG}.ops",
                                     f"{PKG}.ops.rms_norm.eager -> {PKG}.runner.errors",
                                     f"{PKG}.runner.tables.render.plots -> {PKG}.bench.run",
                                     f"{PKG}.settings -> {PKG}",
                                     f"{PKG}.settings -> {PKG}.kernels.errors"]


def test_settings_is_in_the_graph_and_read_by_every_layer():
    """The layer check sees settings (a module of the graph) and its importers."""
    edges = graph()
    assert edges[f"{PKG}.settings"] == set()
    importers = {m.split(".")[1] for m, imported in edges.items() if f"{PKG}.settings" in imported}
    assert {"kernels", "contract", "ops", "runner"} <= importers
