"""Validate, write and read cell reports (docs/report-format.md, schema_version 2).

Writing: :func:`write_report` validates against ``runner/schema/report.schema.json``
and the rules JSON Schema cannot state, then writes ``<cell id>.json`` atomically
(temporary file in the same directory, fsync, ``os.replace``, fsync of the directory),
so a reader never sees half a report and a failed validation never touches an
existing file.

Reading: :func:`read_reports` / :func:`read_report` never raise for a bad file; the
file comes back as a :class:`LoadedReport` whose ``problem`` says why (corrupt or
truncated JSON, not an object, a newer ``schema_version``, failed validation), so
the tables can list it. Reports without ``schema_version`` laid out like the RL-Kernel
reference report (``results[impl]["vs <other>"][case]``, ``environment``, ``cases``)
are read as ``origin="foreign"``. Older schema versions are upgraded one step at a
time by :func:`upgrade`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import jsonschema
from jsonschema.exceptions import best_match
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from gate_residual_matrix.runner.errors import ReportError
from gate_residual_matrix.runner.reports import json_file as report_json
from gate_residual_matrix.runner.reports import tensors as report_tensors
from gate_residual_matrix.runner.reports.checks import (
    CELL_ID_RE,
    bound_problem,
    foreign_problems,
    json_problems,
    ours_problems,
    path_str,
)
from gate_residual_matrix.runner.reports.tensors import PairRow, iter_pairs
from gate_residual_matrix.runner.untrusted.files import remove_stale_temp_files, write_text_atomic

__all__ = ["SCHEMA_PATH", "SCHEMA_VERSION", "UPGRADES", "LoadedReport", "PairRow",
           "fast_validator", "iter_pairs", "read_report", "read_reports", "remove_stale_temp_files",
           "upgrade", "validate", "write_report", "write_text_atomic"]

SCHEMA_VERSION = 2
"""Version 2: the report carries its op's tensors (``tensors``, ``index_groups``)
and ``problem`` the op's sizes; version 1 was gate_residual's alone (:data:`UPGRADES`)."""
SCHEMA_PATH = Path(__file__).resolve().parent / "schema" / "report.schema.json"

_MAX_MESSAGE = 240
_NOT_A_REPORT = (
    "not a report: no schema_version and not the reference layout "
    '(results[impl]["vs <other>"], environment, cases)'
)

Origin = Literal["ours", "foreign"]


@lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    with SCHEMA_PATH.open(encoding="utf-8") as f:
        return json.load(f)


@lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(_schema())


@lru_cache(maxsize=1)
def fast_validator() -> Any:
    """jsonschema-rs's validator for the report schema (same draft), or None where
    jsonschema-rs is not installed (then every report takes the slow pass).

    Only its yes/no is used, to skip the slow pass for valid reports (about 400x faster on a
    real report: 0.05 ms against 21 ms); a report it rejects is checked again by
    :mod:`jsonschema` for the message. Optional: ``pip install .[report]``.
    """
    try:
        import jsonschema_rs
    except ImportError:
        return None
    return jsonschema_rs.validator_for(_schema())


@lru_cache(maxsize=1)
def _foreign_validator() -> jsonschema.Draft202012Validator:
    """Checks ``$defs/foreign_report``: the parts of the reference layout the tables read."""
    schema = _schema()
    registry = Registry().with_resource(schema["$id"], DRAFT202012.create_resource(schema))
    ref = {"$ref": f"{schema['$id']}#/$defs/foreign_report"}
    return jsonschema.Draft202012Validator(ref, registry=registry)


def _one_line(message: str) -> str:
    line = " ".join(message.split())
    return line if len(line) <= _MAX_MESSAGE else line[: _MAX_MESSAGE - 1] + "…"


def _fast_valid(report: Any) -> bool:
    """True when jsonschema-rs is installed and accepts ``report``; False also for what it
    cannot take (a ``str`` subclass such as ``torch.__version__`` raises ValueError there):
    the slow pass then decides."""
    fast = fast_validator()
    try:
        return fast is not None and fast.is_valid(report)
    except (ValueError, TypeError):
        return False


def _foreign_semantic_problems(report: Mapping[str, Any]) -> Iterator[str]:
    """The rules beyond the schema that a foreign report must keep
    (:func:`runner.reports.checks.foreign_problems`)."""
    yield from foreign_problems(report)


def _first_problem(
    report: Any, validator: jsonschema.Draft202012Validator,
    semantic: Callable[[Mapping[str, Any]], Iterator[str]] | None = None,
    json_checked: bool = False,
) -> str | None:
    """One line naming the worst problem and how many others there are, or None.

    ``json_checked``: the caller knows every value is a finite JSON value (parsed text
    without a literal that could be NaN or infinite), so the walk of
    :func:`~runner.reports.checks.json_problems` is skipped.
    """
    problems = [] if json_checked else list(json_problems(report))
    first, count = (problems[0], len(problems)) if problems else (None, 0)
    if first is None and not (validator is _validator() and _fast_valid(report)):
        errors = list(validator.iter_errors(report))
        if errors:
            worst = best_match(errors)
            first, count = f"{path_str(worst.absolute_path)}: {worst.message}", len(errors)
    if first is None and semantic is not None:
        problems = list(semantic(report))
        first, count = (problems[0], len(problems)) if problems else (None, 0)
    if first is None:
        return None
    more = f" (and {count - 1} more)" if count > 1 else ""
    return _one_line(first) + more


def validate(report: dict[str, Any]) -> None:
    """Check a schema_version 2 report (an older one upgraded first); raise
    :class:`ReportError` if it is invalid.

    Checks the JSON Schema (``runner/schema/report.schema.json``), that every value is
    a JSON value (string keys, no NaN/Infinity: infinities are written ``"inf"``), and the
    rules of :func:`runner.reports.checks.ours_problems`: the cell id is
    ``<op's cell prefix><stack>-<mode>-<target>``, each CMP has ``equal == (differ == 0)``,
    counts within ``numel`` and ``numel`` the product of its tensor's shape (``tensors``; N
    from the case), every compared tensor is one of ``tensors``, the case keys of ``inputs``
    and ``"vs <x>"`` maps are listed in ``cases`` and agree with their inputs (n, specials,
    dtypes), a case's ``index_counts`` has one entry per index value (the ``index_groups``
    size) summing to its n, and both directions of a pair agree.

    Raises:
        ReportError: one line, ``<path in the document>: <message>``, e.g.
            ``results.numba["vs eager"]["257"].out[0].max_abs: nan is not valid ...``.

    Example:
        >>> validate({"schema_version": 2})
        Traceback (most recent call last):
        ReportError: invalid report: (root): 'kind' is a required property (and 6 more)
    """
    _validate(_current(report))


def _current(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` upgraded when it is of an older version (an integer below
    :data:`SCHEMA_VERSION`), else itself (a bad version is the schema's to report)."""
    version = report.get("schema_version") if isinstance(report, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version < SCHEMA_VERSION:
        return upgrade(report)
    return report


def _validate(report: dict[str, Any], json_checked: bool = False) -> None:
    """:func:`validate`, optionally without the JSON-value walk (see :func:`_first_problem`)."""
    problem = _first_problem(report, _validator(), ours_problems, json_checked)
    if problem is not None:
        raise ReportError(f"invalid report: {problem}")


def write_report(report: dict[str, Any], directory: Path) -> Path:
    """Validate ``report`` and write it atomically to ``<directory>/<cell id>.json`` (a
    report of an older schema version is written upgraded: :func:`upgrade`).

    The JSON is indented by 2, keys in the order given, ``allow_nan=False``, with a final
    newline. ``directory`` is created if missing.

    Returns:
        The path written.
    Raises:
        ReportError: the report is invalid (see :func:`validate`) or its cell id is not
            ``^[A-Za-z0-9][A-Za-z0-9_.-]*$``; nothing is written then.
        OSError: the directory cannot be written.

    Example:
        >>> write_report(report, Path("reports"))
        PosixPath('reports/host-plain-cuda.json')
    """
    cell = report.get("cell")
    cell_id = cell.get("id") if isinstance(cell, dict) else None
    if not isinstance(cell_id, str) or not CELL_ID_RE.fullmatch(cell_id):
        raise ReportError(
            f"invalid report: cell.id: expected a name matching {CELL_ID_RE.pattern}, "
            f"got {cell_id!r}"
        )
    report = _current(report)
    validate(report)  # also rules out what json.dumps(allow_nan=False) would reject
    text = json.dumps(report, indent=2, sort_keys=False, allow_nan=False) + "\n"
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{cell_id}.json"
    write_text_atomic(path, text)
    return path


@dataclass(frozen=True)
class LoadedReport:
    """One report file as read: its data, or why it could not be read.

    Attributes:
        path: the file.
        data: the (upgraded) report, or None when ``problem`` is set.
        origin: ``"ours"`` (has ``schema_version``), ``"foreign"`` (the reference
            layout without ``schema_version``), or None when not even that is known.
        problem: one line saying why the file was not read, or None.
    """

    path: Path
    data: dict[str, Any] | None
    origin: Origin | None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        """True when the file was read (``data`` is set, ``problem`` is None)."""
        return self.problem is None


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 -> 2: the tensors of the first op's spec, the only op version 1 had
    (:func:`runner.reports.tensors.upgrade_v1`)."""
    return report_tensors.upgrade_v1(data)


UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2}
"""``UPGRADES[v]`` turns a version-``v`` report into a version-``v + 1`` one (new dict)."""


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """Bring a report of an older ``schema_version`` to :data:`SCHEMA_VERSION`, one step each.

    Version 2 is returned as is; version 1 gains its op's ``tensors`` (:func:`_v1_to_v2`).

    Raises:
        ReportError: the version is not an integer, newer than this reader (refused),
            or has no upgrade step.
    """
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ReportError(f"schema_version: expected an integer, got {version!r}")
    if version > SCHEMA_VERSION:
        raise ReportError(
            f"schema_version {version} is newer than this runner reads "
            f"({SCHEMA_VERSION}): refused; update the runner"
        )
    while version < SCHEMA_VERSION:
        step = UPGRADES.get(version)
        if step is None:
            raise ReportError(f"schema_version {version} is unknown: no upgrade step")
        data = step(data)
        version = data["schema_version"]
    return data


KIND = "gate_residual_matrix"
"""The ``kind`` of every report of this project (its name; every op's reports share it)."""
_OUR_KEYS = ("cell", "fingerprint")
"""Top-level keys that only our reports have (the reference layout has neither)."""
def _ours_without_version(data: Mapping[str, Any]) -> str | None:
    """The problem of a report of ours that lost its ``schema_version``, or None when
    ``data`` is not one (its ``kind`` is ours, or it has our ``cell`` and ``fingerprint``):
    such a file is refused, never read as a foreign report."""
    if data.get("kind") == KIND:
        why = f'kind "{KIND}"'
    elif all(key in data for key in _OUR_KEYS):
        why = "keys cell and fingerprint"
    else:
        return None
    return (f"schema_version: missing from a report of this runner ({why}): refused, not "
            "read as a foreign report")


def _is_foreign_layout(data: Mapping[str, Any]) -> bool:
    results = data.get("results")
    has_vs = isinstance(results, dict) and any(
        isinstance(e, dict) and any(str(k).startswith("vs ") for k in e) for e in results.values()
    )
    return has_vs and "environment" in data and "cases" in data


def read_report(path: Path) -> LoadedReport:
    """Read one report file; never raises for a bad file (see :class:`LoadedReport`).

    Ours (``schema_version`` present) is upgraded (:func:`upgrade`) and validated;
    a newer version is refused. A file without ``schema_version`` in the reference
    layout is read as ``"foreign"`` after checking the parts :func:`iter_pairs` reads.

    Example:
        >>> read_report(Path("reports/reference/gate_residual_b200.json")).origin
        'foreign'
    """
    path = Path(path)
    try:
        data, json_checked = report_json.load(path)
    except ReportError as err:
        return LoadedReport(path, None, None, str(err))
    if not isinstance(data, dict):
        return LoadedReport(
            path, None, None, f"not a report: the JSON is a {type(data).__name__}, not an object"
        )
    too_big = bound_problem(data)
    if too_big is not None:
        origin = "ours" if "schema_version" in data or _ours_without_version(data) else (
            "foreign" if _is_foreign_layout(data) else None)
        return LoadedReport(path, None, origin, too_big)
    if "schema_version" in data:
        try:
            data = upgrade(data)
            _validate(data, json_checked)
        except ReportError as err:
            return LoadedReport(path, None, "ours", str(err))
        return LoadedReport(path, data, "ours")
    ours = _ours_without_version(data)
    if ours is not None:
        return LoadedReport(path, None, "ours", ours)
    if _is_foreign_layout(data):
        problem = _first_problem(data, _foreign_validator(), _foreign_semantic_problems,
                                 json_checked)
        if problem is not None:
            return LoadedReport(path, None, "foreign", f"unreadable foreign report: {problem}")
        return LoadedReport(path, data, "foreign")
    return LoadedReport(path, None, None, _NOT_A_REPORT)


def read_reports(directory: Path, skip: Collection[str] = ()) -> list[LoadedReport]:
    """Read every ``*.json`` under ``directory`` (recursively, sorted by path).

    Files under a ``bench/`` directory (below ``directory``) are skipped, and so is every
    hidden path (a name starting with ``.``): the temporary files of an interrupted
    :func:`write_text_atomic` and a backend's staging directories are never reports. A bad
    file does not stop the others: it comes back with ``problem`` set. So does a second
    report of one cell (ours: the same ``cell.id``; of the files named ``<cell id>.json``, or
    of all where none is, the one fewest folders below ``directory`` is read, the first by
    path among equals, so a copy under a subfolder does not stand in for ``<cell id>.json``
    beside it; foreign: everything but ``results`` the same, the first by path is read,
    whatever its depth): each other is flagged as a duplicate and left out.
    Paths whose :func:`os.path.realpath` is in ``skip`` are not read at all (the tables' own
    ``summary.json``: a huge one took seconds to parse only to be dropped).

    Raises:
        ReportError: ``directory`` is not a directory.

    Example:
        >>> [r.path.name for r in read_reports(Path("reports"))]
        ['host-plain-cuda.json', 'gate_residual_b200.json']
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ReportError(f"{directory}: reports directory not found")
    paths = sorted(
        p for p in directory.rglob("*.json")
        if "bench" not in (parts := p.relative_to(directory).parts)[:-1]
        and not any(part.startswith(".") for part in parts)
        and not (skip and os.path.realpath(p) in skip)
    )
    return _flag_duplicates([read_report(p) for p in paths], directory)


def _foreign_identity(data: Mapping[str, Any]) -> str:
    """What makes a foreign report one cell: everything but its ``results`` (kind, op, the
    library's commit, environment, cases, any timestamps), as canonical JSON."""
    return json.dumps({k: v for k, v in data.items() if k != "results"}, sort_keys=True)


def _flag_duplicates(reports: list[LoadedReport], directory: Path) -> list[LoadedReport]:
    """``reports`` with every second report of a cell turned into a problem naming the one
    kept (relative to ``directory``). Ours are one cell by ``cell.id`` (of the files named
    ``<cell id>.json``, else of all, the one fewest folders deep is kept, the first by path
    among equals); foreign ones by :func:`_foreign_identity` (the first by path is kept)."""
    by_id: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(reports):
        if not r.ok or r.data is None:  # not read: nothing to compare
            continue
        if r.origin == "ours":
            by_id.setdefault(("ours", str(r.data["cell"]["id"])), []).append(i)
        else:
            by_id.setdefault(("foreign", _foreign_identity(r.data)), []).append(i)
    out = list(reports)
    for (origin, cell_id), indices in by_id.items():
        if len(indices) < 2:
            continue
        named = [i for i in indices if reports[i].path.name == f"{cell_id}.json"]
        kept = (min(named or indices, key=lambda i: len(reports[i].path.parts))
                if origin == "ours" else indices[0])
        there = reports[kept].path.relative_to(directory).as_posix()
        problem = (f'duplicate cell id "{cell_id}": {there} is that cell\'s report; this one '
                   "is left out") if origin == "ours" else (
                   f"duplicate foreign report: {there} is the same cell (all but its results "
                   "equal); this one is left out")
        for i in indices:
            if i != kept:
                out[i] = LoadedReport(reports[i].path, None, reports[i].origin, problem)
    return out
