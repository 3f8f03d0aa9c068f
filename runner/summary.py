"""The tables for other tools: ``reports/summary.csv`` and ``reports/summary.json``.

``summary.csv`` is one long table, one row per cell x implementation x case x tensor
(:data:`COLUMNS`), with the case's dtypes (:mod:`runner.table_cases`) and fewest and most rows
per index value, the tensor's sha256, its comparison with the cell's baseline (or, in a
foreign report, the implementation it was compared with), its accuracy against fp64, the
determinism verdicts and the case's median times (repeated on each tensor's row). A cell with
no results has one row with its status and reason and empty implementation columns (its
problem's dtypes).

``summary.json`` holds the same rows (typed: numbers, booleans, null) under ``rows``, plus
``cells`` (each with its configuration), ``across`` (cells grouped by identical bits) and
``unreadable``. Its ``schema`` is ``"gate_residual_tables/2"`` (2: ``index_rows_min/max``, and
the tensors each op names; 1 had ``gate_rows_min/max``).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from json.encoder import encode_basestring as _string
from typing import TYPE_CHECKING, Any

from runner import report_tensors
from runner.aggregate import Cell
from runner.table_ab import configuration
from runner.table_bits import AcrossRow
from runner.table_cases import CaseFilter, case_dtypes, index_rows

if TYPE_CHECKING:
    from runner.tables import Tables

__all__ = ["COLUMNS", "SCHEMA", "render_csv", "render_json", "summary_rows"]

SCHEMA = "gate_residual_tables/2"
COLUMNS = (
    "cell", "origin", "op", "stack", "mode", "target", "dtype", "index_dtype", "gpu", "status",
    "reason", "impl", "impl_status", "case", "index_rows_min", "index_rows_max", "tensor",
    "sha256", "vs", "equal", "differ", "numel",
    "vs_max_abs", "vs_max_ulp", "max_abs", "max_rel", "max_abs_ulps", "rel_l2", "repeatable",
    "repeatable_across_processes", "forward_ms", "forward_backward_ms",
)


def _partner(cell: Cell, impl: str, entry: dict[str, Any]) -> str | None:
    baseline = cell.data.get("baseline")
    if impl != baseline and f"vs {baseline}" in entry:
        return str(baseline)
    return next((k[3:] for k in entry if k.startswith("vs ")), None)


def _case_of(entry: dict[str, Any], key: str, case: str) -> dict[str, Any]:
    return (entry.get(key) or {}).get(case) or {}


def _cell_rows(cell: Cell, keeps_impl: Any, by_dtype: CaseFilter) -> Iterator[dict[str, Any]]:
    problem = cell.data.get("problem") or {}
    base = {"cell": cell.label, "origin": cell.origin, "op": cell.op, "stack": cell.stack,
            "mode": cell.mode, "target": cell.target, "dtype": problem.get("dtype"),
            "index_dtype": problem.get("index_dtype"), "gpu": cell.gpu,
            "status": cell.data.get("status"), "reason": cell.reason}
    emitted = False
    for impl, entry in cell.results.items():
        if not keeps_impl(impl):
            continue
        vs = _partner(cell, impl, entry)
        compared = entry.get(f"vs {vs}") or {} if vs else {}
        keys = ("sha256", "accuracy", "repeatable", "repeatable_across_processes", "timings")
        cases = list(dict.fromkeys([*(c for k in keys for c in entry.get(k) or {}), *compared]))
        for case in by_dtype.cases(cell, cases):
            dtype, index_dtype = case_dtypes(cell, case)
            rows = index_rows(cell, case) or (None, None)
            per_case = {**base, "dtype": dtype, "index_dtype": index_dtype,
                        "index_rows_min": rows[0], "index_rows_max": rows[1]}
            acc = _case_of(entry, "accuracy", case)
            figures = {"out": acc.get("out"), **(acc.get("grads") or {})}
            cmp_case = compared.get(case) or {}
            cmps = {"out": (cmp_case.get("out") or [None])[0], **(cmp_case.get("grads") or {})}
            timing = _case_of(entry, "timings", case)
            for tensor in report_tensors.labels(cell.data):
                sha = _case_of(entry, "sha256", case).get(tensor)
                fig, cmp = figures.get(tensor) or {}, cmps.get(tensor) or {}
                rep = _case_of(entry, "repeatable", case).get(tensor)
                across = _case_of(entry, "repeatable_across_processes", case).get(tensor)
                if not (sha or fig or cmp or rep is not None or across is not None):
                    continue
                emitted = True
                yield {**per_case, "impl": impl, "impl_status": entry.get("status"),
                       "case": case, "tensor": tensor, "sha256": sha, "vs": vs if cmp else None,
                       "equal": cmp.get("equal"), "differ": cmp.get("differ"),
                       "numel": cmp.get("numel"), "vs_max_abs": cmp.get("max_abs"),
                       "vs_max_ulp": cmp.get("max_ulp"), "max_abs": fig.get("max_abs"),
                       "max_rel": fig.get("max_rel"), "max_abs_ulps": fig.get("max_abs_ulps"),
                       "rel_l2": fig.get("rel_l2"), "repeatable": rep,
                       "repeatable_across_processes": across,
                       "forward_ms": timing.get("forward_ms"),
                       "forward_backward_ms": timing.get("forward_backward_ms")}
    if not emitted:
        yield {**base, **{k: None for k in COLUMNS if k not in base}}


def summary_rows(tables: Tables) -> list[dict[str, Any]]:
    """Every row of ``summary.csv``, typed, keys in :data:`COLUMNS` order (computed once per
    :class:`~runner.tables.Tables`: the CSV and the JSON share them)."""
    cached = tables.cache.get("summary_rows")
    if cached is None:
        cached = tables.cache["summary_rows"] = [
            row for cell in tables.cells
            for row in _cell_rows(cell, tables.filters.keeps_impl, CaseFilter.of(tables.filters))]
    return cached


_FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
"""A spreadsheet treats a cell starting with one of these as a formula (OWASP CSV injection)."""


def _csv_value(value: Any) -> Any:
    """A CSV field: None empty, booleans ``true``/``false``, numbers as they are, and text
    that a spreadsheet would run as a formula prefixed with ``'`` (OWASP's rule)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and value.startswith(_FORMULA_PREFIXES):
        return "'" + value
    return value


def render_csv(tables: Tables) -> str:
    """``summary.csv``: a header line, then :func:`summary_rows` (``\\n`` line ends)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    prefixes, words = _FORMULA_PREFIXES, {True: "true", False: "false"}
    # _csv_value inlined: a call per value was a tenth of the time for 7.7 million values
    writer.writerows([("" if v is None else words[v] if v is True or v is False else
                       "'" + v if isinstance(v, str) and v.startswith(prefixes) else v)
                      for v in map(row.__getitem__, COLUMNS)] for row in summary_rows(tables))
    return buffer.getvalue()


def _groups(row: AcrossRow, labels: list[str]) -> list[dict[str, Any]]:
    return [{"sha256": sha, "cells": [labels[i] for i in members]} for sha, members in row.groups]


_SCALARS = {None: "null", True: "true", False: "false"}


def _float(value: float) -> str:
    """A float as :mod:`json` writes it (``allow_nan=True``: NaN, Infinity)."""
    if value != value:
        return "NaN"
    if value in (_INF, -_INF):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)


_INF = float("inf")


def _key(key: Any) -> str:
    """A non-string dict key as :mod:`json` turns it into one."""
    if isinstance(key, float):
        return _float(key)
    if key is None or key is True or key is False:
        return _SCALARS[key]
    if isinstance(key, int):
        return int.__repr__(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def _emit(value: Any, newline: str, out: list[str]) -> None:
    """Append ``value`` as ``json.dumps(value, indent=1, ensure_ascii=False)`` writes it
    below an indentation of ``newline`` (``"\n"`` plus one space per level)."""
    if isinstance(value, str):
        out.append(_string(value))
    elif value is None or value is True or value is False:
        out.append(_SCALARS[value])
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(_float(value))
    elif isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        inner, lead = newline + " ", "{"
        for key, item in value.items():
            if not isinstance(key, str):
                key = _key(key)
            if isinstance(item, str):  # the common leaf without a call
                out.append(f"{lead}{inner}{_string(key)}: {_string(item)}")
            else:
                out.append(f"{lead}{inner}{_string(key)}: ")
                _emit(item, inner, out)
            lead = ","
        out.append(newline + "}")
    elif isinstance(value, (list, tuple)):
        if not value:
            out.append("[]")
            return
        inner = newline + " "
        if all(isinstance(item, str) for item in value):  # a list of names, in one piece
            out.append(f"[{inner}{(',' + inner).join(map(_string, value))}{newline}]")
            return
        lead = "["
        for item in value:
            out.append(lead + inner)
            _emit(item, inner, out)
            lead = ","
        out.append(newline + "]")
    else:
        out.append(json.dumps(value, ensure_ascii=False))  # its TypeError, as json.dumps


def dumps_indented(value: Any) -> str:
    """``json.dumps(value, indent=1, ensure_ascii=False)``, the same text several times
    faster: with an indent, :mod:`json` falls back to its pure-Python encoder, which took
    9 s of the 26 s that ``summary.json`` of a 20,000-case report took to render.

    Example:
        >>> dumps_indented({"a": [1, 2.5, None], "b": {}})
        '{\n "a": [\n  1,\n  2.5,\n  null\n ],\n "b": {}\n}'
    """
    out: list[str] = []
    _emit(value, "\n", out)
    return "".join(out)


def render_json(tables: Tables) -> str:
    """``summary.json`` (see the module docstring); keys in a fixed order, one row per line."""
    labels = [c.label for c in tables.cells]
    across = tables.across
    doc = {
        "schema": SCHEMA,
        "summary": tables.summary_line(),
        "filters": {k: list(v) for k, v in vars(tables.filters).items() if v},
        "cells": [{"cell": c.label, "origin": c.origin, "file": c.report.path.name,
                   "status": c.data.get("status"), "reason": c.reason,
                   "configuration": configuration(c)} for c in tables.cells],
        "across": {
            "problems": [{"problem": p, "description": d, "cells": [labels[i] for i in m]}
                         for p, d, m in across.problems],
            "inputs": [{"problem": r.problem, "case": r.case, "void": r.void,
                        "differing": [] if not r.void else r.tensor.split(", "),
                        "groups": _groups(r, labels)} for r in across.inputs],
            "outputs": [{"problem": r.problem, "impl": r.impl, "case": r.case,
                         "tensor": r.tensor, "verdict": r.verdict(), "void": r.void,
                         "groups": _groups(r, labels)} for r in across.rows],
            "without_bits": [{"cell": labels[i], "why": why} for i, why in across.without],
        },
        "unreadable": [{"file": f, "problem": p} for f, p in tables.unreadable],
    }
    head = dumps_indented(doc)
    encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode
    rows = ",\n  ".join(map(encode, summary_rows(tables)))
    return head[:-2] + f',\n "rows": [\n  {rows}\n ]\n}}\n' if rows else (
        head[:-2] + ',\n "rows": []\n}\n')
