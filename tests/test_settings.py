"""gate_residual_matrix/settings.py: its accessors, docs/settings.md, and that the code reads
no environment variable the module does not declare.

The scan reads the source with :mod:`ast`: ``os.environ[K]``, ``os.environ.get(K)``,
``os.environ.setdefault(K)``, ``K in os.environ``, ``os.getenv(K)`` (also through ``from os
import environ, getenv``), with ``K`` a string literal, a module-level string constant of the
module, or one imported from another module of the package (``shards.ENV``); a key it cannot
resolve, and ``os.environ.items()`` / ``keys()`` / ``values()``, are reads of unknown
variables. Calls of ``settings.get``, ``raw``, ``setdefault`` and ``matching`` count as reads
of the setting they name (``settings`` is the module's name wherever it is bound). Writes
(``os.environ[K] = v``, ``pop``) and the whole environment passed to a child
(``{**os.environ}``, ``dict(os.environ)``) are not reads.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from gate_residual_matrix import settings
from gate_residual_matrix.runner import __main__ as cli

ROOT = Path(__file__).resolve().parents[1]
PKG = "gate_residual_matrix"
SCANNED = [*sorted(p for p in (ROOT / PKG).rglob("*.py")
                   if p != ROOT / PKG / "settings.py" and "build" not in p.parts),
           ROOT / "noxfile.py"]
"""Every file whose reads must be declared: settings.py itself is the one place that reads
``os.environ`` by a variable's name."""
ACCESSORS = {"get", "raw", "setdefault", "matching"}
WHOLE = {"items", "keys", "values"}


@dataclass(frozen=True)
class Read:
    """One read: ``name`` None where the key is not a literal or a known constant."""

    where: str
    name: str | None
    code: str


def constants(tree: ast.Module) -> dict[str, str]:
    """The module-level ``NAME = "text"`` assignments of ``tree``."""
    out = {}
    for node in tree.body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            out |= {t.id: value.value for t in targets if isinstance(t, ast.Name)}
    return out


@functools.cache
def package_constants(module: str) -> dict[str, str]:
    """:func:`constants` of a module of the package (empty for one not found)."""
    base = ROOT / Path(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return constants(ast.parse(path.read_text(encoding="utf-8")))
    return {}


def env_reads(source: str, where: str,
              resolve: Callable[[str], dict[str, str]] = package_constants) -> list[Read]:
    """Every environment read of ``source`` (see the module docstring); ``resolve(module)``
    gives another module's string constants, for keys imported from it."""
    tree = ast.parse(source)
    names = dict(constants(tree))  # local name -> text
    modules: dict[str, str] = {}  # local name -> a module of the package
    environ, getenv, settings_names = set(), set(), {"settings"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            environ |= {a.asname or a.name for a in node.names if a.name == "environ"}
            getenv |= {a.asname or a.name for a in node.names if a.name == "getenv"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PKG):
            for a in node.names:
                local = a.asname or a.name
                if f"{node.module}.{a.name}" == f"{PKG}.settings":
                    settings_names.add(local)
                elif a.name in resolve(node.module):
                    names[local] = resolve(node.module)[a.name]
                else:
                    modules[local] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == f"{PKG}.settings" and a.asname:
                    settings_names.add(a.asname)
                elif a.name.startswith(PKG) and a.asname:
                    modules[a.asname] = a.name

    def is_environ(node: ast.AST) -> bool:
        return ((isinstance(node, ast.Attribute) and node.attr == "environ"
                 and isinstance(node.value, ast.Name) and node.value.id == "os")
                or (isinstance(node, ast.Name) and node.id in environ))

    def is_getenv(node: ast.AST) -> bool:
        return ((isinstance(node, ast.Attribute) and node.attr == "getenv"
                 and isinstance(node.value, ast.Name) and node.value.id == "os")
                or (isinstance(node, ast.Name) and node.id in getenv))

    def key(node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return names.get(node.id)
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules):
            return resolve(modules[node.value.id]).get(node.attr)
        return None

    out = []

    def add(node: ast.AST, name: str | None) -> None:
        out.append(Read(f"{where}:{node.lineno}", name, ast.unparse(node)))

    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and is_environ(
                node.value):
            add(node, key(node.slice))
        elif isinstance(node, ast.Compare) and any(
                isinstance(op, ast.In | ast.NotIn) for op in node.ops) and any(
                is_environ(c) for c in node.comparators):
            add(node, key(node.left))
        elif isinstance(node, ast.Call):
            fn, first = node.func, node.args[0] if node.args else None
            if is_getenv(fn):
                add(node, key(first))
            elif isinstance(fn, ast.Attribute) and is_environ(fn.value):
                if fn.attr in ("get", "setdefault"):
                    add(node, key(first))
                elif fn.attr in WHOLE:
                    add(node, None)
            elif (isinstance(fn, ast.Attribute) and fn.attr in ACCESSORS
                  and isinstance(fn.value, ast.Name) and fn.value.id in settings_names):
                name = key(first)
                if name is not None:  # a computed name is checked when it is read
                    add(node, name + "*" if fn.attr == "matching" else name)
    return out


def problems(reads: list[Read], declared: set[str]) -> list[str]:
    """One line per read of a variable ``declared`` does not hold, or of an unknown one."""
    return [f"{r.where}: {r.code}: " + (f"{r.name} is not declared in settings.py"
                                        if r.name else "reads a variable it does not name")
            for r in reads if r.name not in declared]


def scan(paths: list[Path]) -> list[Read]:
    return [r for p in paths for r in env_reads(p.read_text(encoding="utf-8"),
                                                str(p.relative_to(ROOT)))]


def test_every_environment_read_is_declared():
    reads = scan(SCANNED)
    assert len(reads) > 20  # the scan sees the reads (through settings)
    assert problems(reads, set(settings.SETTINGS)) == []


def test_every_project_variable_is_read_somewhere():
    """A GATE_RESIDUAL_* setting nothing reads (here, in noxfile.py or in the tests) is
    documentation gone stale."""
    read = {r.name for r in scan(SCANNED + sorted((ROOT / "tests").glob("*.py")))}
    unread = [n for n in settings.SETTINGS if n.startswith("GATE_RESIDUAL_") and n not in read]
    assert unread == []


SYNTHETIC = '''
import os
from os import environ, getenv as ge
from gate_residual_matrix import settings
from gate_residual_matrix.runner.backends import shards
from gate_residual_matrix.contract.gpu_lock import ENV as LOCK
VAR = "GATE_RESIDUAL_NOT_DECLARED"
a = os.environ["LITERAL"]
b = os.environ.get(VAR, "x")
c = "IN_TEST" in os.environ
d = ge("BY_GETENV")
e = environ.setdefault("BY_SETDEFAULT", "1")
f = os.environ.get(name_from_somewhere)
g = settings.get("GATE_RESIDUAL_SHARDS")
h = os.environ.items()
i = os.environ.get(shards.ENV)
j = os.environ[LOCK]
k = settings.matching("NOT_A_PREFIX_")
os.environ["WRITTEN"] = "1"
os.environ.pop("POPPED", None)
child = {**os.environ, "SET_FOR_A_CHILD": "1"}
'''


def test_the_scan_finds_reads_and_fails_on_undeclared_ones():
    reads = env_reads(SYNTHETIC, "synthetic.py")
    assert [r.name for r in reads] == [
        "LITERAL", "GATE_RESIDUAL_NOT_DECLARED", "IN_TEST", "BY_GETENV", "BY_SETDEFAULT",
        None, "GATE_RESIDUAL_SHARDS", None, "GATE_RESIDUAL_SHARDS", "GATE_RESIDUAL_GPU_LOCK",
        "NOT_A_PREFIX_*"]
    found = problems(reads, set(settings.SETTINGS))
    assert len(found) == 8
    assert found[0] == ("synthetic.py:8: os.environ['LITERAL']: LITERAL is not declared in "
                        "settings.py")
    assert found[5] == ("synthetic.py:13: os.environ.get(name_from_somewhere): reads a "
                        "variable it does not name")
    assert problems(reads, {r.name for r in reads if r.name}) == [
        "synthetic.py:13: os.environ.get(name_from_somewhere): reads a variable it does not "
        "name", "synthetic.py:15: os.environ.items(): reads a variable it does not name"]


def test_docs_settings_md_is_the_rendering():
    """Regenerate with ``python -m gate_residual_matrix.settings > docs/settings.md``."""
    assert (ROOT / "docs" / "settings.md").read_text(encoding="utf-8") == \
        settings.render_markdown()


def test_every_setting_is_documented_once_under_its_kind():
    text = settings.render_markdown()
    for s in settings.SETTINGS.values():
        assert text.count(f"| `{s.name}` |") == 1, s.name
        assert s.help.endswith(".") and "\n" not in s.help, s.name
    sections = text.split("\n## ")[1:]
    assert [s.splitlines()[0] for s in sections] == list(settings.TITLES.values())


@pytest.mark.parametrize(("name", "value", "want"), [
    ("GATE_RESIDUAL_SHARDS", None, None), ("GATE_RESIDUAL_SHARDS", "auto", None),
    ("GATE_RESIDUAL_SHARDS", "12", 12),
    ("GATE_RESIDUAL_PROGRESS", None, "auto"), ("GATE_RESIDUAL_PROGRESS", "", "auto"),
    ("GATE_RESIDUAL_PROGRESS", "off", "off"),
    ("GATE_RESIDUAL_PRECOMPILE", "0", 0), ("GATE_RESIDUAL_PRECOMPILE", "", None),
    ("GATE_RESIDUAL_CUBIN_CACHE", "OFF", "off"), ("GATE_RESIDUAL_CUBIN_CACHE", "false", "off"),
    ("GATE_RESIDUAL_CUBIN_CACHE", "/c", "/c"), ("GATE_RESIDUAL_CUBIN_CACHE", "", None),
    ("GATE_RESIDUAL_FAULTS", "1", True), ("GATE_RESIDUAL_FAULTS", "0", False),
    ("GATE_RESIDUAL_FAULTS", "", False), ("GATE_RESIDUAL_FAULT", "", "none"),
    ("GATE_RESIDUAL_FAULT_OOM_MB", None, 512), ("GATE_RESIDUAL_FAULT_KILL_ROWS", "7", 7),
    ("GATE_RESIDUAL_LAUNCH", None, "ctypes"), ("GATE_RESIDUAL_GPU_LOCK", "", None),
    ("GATE_RESIDUAL_CELL_DEADLINE", "12.5", 12.5), ("GATE_RESIDUAL_PARENT_PID", " 42", 42),
    ("RLK_BUILD_DIR", None, "/tmp/gate-residual-rl-kernel-build"),
])
def test_values_and_defaults(name, value, want):
    env = {} if value is None else {name: value}
    assert settings.get(name, env) == want


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("GATE_RESIDUAL_SHARDS", "", "a positive integer (at most 6 digits) or 'auto'"),
    ("GATE_RESIDUAL_SHARDS", "\u00b2", "a positive integer (at most 6 digits) or 'auto'"),
    ("GATE_RESIDUAL_PROGRESS", "bar", "one of auto, plain, off"),
    ("GATE_RESIDUAL_PRECOMPILE", "-1", "a whole number >= 0 or 'auto'"),
    ("GATE_RESIDUAL_FAULTS", "yes", "1 or 0"),
    ("GATE_RESIDUAL_FAULT", "segfault", "one of none, raise, hang, oom, kill, illegal_address"),
    ("GATE_RESIDUAL_FAULT_OOM_MB", "", "a whole number of MiB >= 1"),
    ("GATE_RESIDUAL_FAULT_OOM_MB", "0", "a whole number of MiB >= 1"),
    ("GATE_RESIDUAL_FAULT_HANG_ROWS", "x", "a whole number of rows"),
    ("GATE_RESIDUAL_LAUNCH", "", "one of ctypes, driver, core"),
    ("GATE_RESIDUAL_DEBUG", "true", "1 or 0"),
])
def test_a_bad_value_is_one_line_naming_the_variable_and_the_values(name, value, expected):
    with pytest.raises(settings.SettingError) as err:
        settings.get(name, {name: value})
    assert str(err.value) == f"{name}={value!r}: expected {expected}"
    assert settings.get(name, {name: value}, strict=False) == settings.SETTINGS[name].default


def test_undeclared_names_are_defects_not_defaults():
    for call in (lambda: settings.get("GATE_RESIDUAL_NOPE", {}),
                 lambda: settings.raw("NOPE", {}), lambda: settings.matching("NOPE_", {})):
        with pytest.raises(KeyError, match=r"not declared in gate_residual_matrix/settings\.py"):
            call()


def test_matching_and_setdefault(monkeypatch):
    env = {"NUMBA_OPT": "0", "NUMBA_DEBUG": "1", "NUMBAX": "2"}
    assert settings.matching("NUMBA_", env) == [("NUMBA_DEBUG", "1"), ("NUMBA_OPT", "0")]
    monkeypatch.delenv("RLK_BUILD_DIR", raising=False)
    settings.setdefault("RLK_BUILD_DIR")
    assert settings.raw("RLK_BUILD_DIR") == "/tmp/gate-residual-rl-kernel-build"
    monkeypatch.setenv("RLK_BUILD_DIR", "/mine")
    settings.setdefault("RLK_BUILD_DIR")
    assert settings.raw("RLK_BUILD_DIR") == "/mine"


def test_the_command_line_prints_a_bad_setting_as_one_line_and_exits_2(monkeypatch, capsys):
    monkeypatch.setenv("GATE_RESIDUAL_PROGRESS", "bar")
    monkeypatch.setattr(cli, "_cmd_report", lambda args: settings.get("GATE_RESIDUAL_PROGRESS"))
    assert cli.main(["report"]) == 2
    assert capsys.readouterr().err == (
        "error: GATE_RESIDUAL_PROGRESS='bar': expected one of auto, plain, off\n")
