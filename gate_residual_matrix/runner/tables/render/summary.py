"""The tables for other tools: ``reports/summary.csv`` and ``reports/summary.json``.

``summary.csv`` is one long table, one row per cell x implementation x case x tensor
(:data:`~runner.tables.model.summary_rows.COLUMNS`, built by
:func:`~runner.tables.model.summary_rows.summary_rows`).

``summary.json`` holds the same rows (typed: numbers, booleans, null) under ``rows``, plus
``cells`` (each with its configuration), ``across`` (cells grouped by identical bits) and
``unreadable``. Its ``schema`` is ``"gate_residual_tables/2"`` (2: ``index_rows_min/max``, and
the tensors each op names; 1 had ``gate_rows_min/max``).
"""

from __future__ import annotations

import csv
import io
import json
from json.encoder import encode_basestring as _string
from typing import Any

from gate_residual_matrix.runner.tables.model.bits import AcrossRow
from gate_residual_matrix.runner.tables.model.build import Tables
from gate_residual_matrix.runner.tables.model.cells import configuration
from gate_residual_matrix.runner.tables.model.summary_rows import COLUMNS, summary_rows
from gate_residual_matrix.runner.untrusted.names import shown

__all__ = ["SCHEMA", "dumps_indented", "render_csv", "render_json"]

SCHEMA = "gate_residual_tables/2"
"""``summary.json``'s ``schema`` (2: ``index_rows_min/max`` and each op's tensors)."""

_FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
"""A spreadsheet treats a cell starting with one of these as a formula (OWASP CSV injection)."""


def render_csv(tables: Tables) -> str:
    """``summary.csv``: a header line, then :func:`summary_rows` (``\\n`` line ends).

    A field is empty for None, ``true``/``false`` for booleans, a number as it is, and text
    that a spreadsheet would run as a formula (:data:`_FORMULA_PREFIXES`) is prefixed with
    ``'`` (OWASP's rule)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    prefixes, words = _FORMULA_PREFIXES, {True: "true", False: "false"}
    # inline, not a function per value: a call was a tenth of the time for 7.7 million values
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
        "cells": [{"cell": c.label, "origin": c.origin, "file": shown(c.report.path.name),
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
