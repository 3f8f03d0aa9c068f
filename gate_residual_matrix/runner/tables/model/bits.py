"""The tables about bits: pairwise per cell and identical bits across cells (A/B: :mod:`.ab`).

* :func:`bitwise_table`: per cell, each unordered implementation pair x case, each tensor
  ``equal`` or ``differ/numel`` (``results[impl]["vs <other>"][case]``), then the largest
  |a - b| and the largest distance in representable values ("ULP apart") per differing tensor.
* :func:`across_cells`: per problem (op, dtype, sizes, index dtype, seed), implementation, case and
  tensor, the cells grouped by the sha256 of the tensor's bits
  (``results[impl].sha256[case][tensor]``). A case's problem uses the case's own dtypes
  (:mod:`runner.tables.model.cases`), and its id there drops them (``257-float16-int32`` is case
  ``257`` of a float16/int32 problem). The inputs' sha256 (``inputs[case].sha256``) must
  agree across the cells of a problem and case; where they do not, every comparison of that
  case is marked void.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gate_residual_matrix.runner.reports import tensors as report_tensors
from gate_residual_matrix.runner.reports.store import iter_pairs
from gate_residual_matrix.runner.tables.model.cases import (
    CaseFilter,
    Problem,
    base_case,
    case_order,
    case_problem,
    dtype_label,
)
from gate_residual_matrix.runner.tables.model.cells import CellReport
from gate_residual_matrix.runner.tables.model.filters import Filters
from gate_residual_matrix.runner.tables.model.table import Row, Table
from gate_residual_matrix.runner.tables.model.values import ABSENT, cmp_kind, num, status_kind, text

__all__ = ["NOTHING_TO_COMPARE", "Across", "AcrossRow", "PairResult", "across_cells",
           "across_tables", "bitwise_table", "pair_results"]

LEGEND = (
    "Each tensor ({legend}): `equal` (every "
    "element has the same bits), or `differ/numel`: elements whose bits differ, of the element "
    "count (`nan k`: k of them are NaN on at least one side). `—`: the tensor is absent (no "
    "backward). For each differing tensor, `max abs(a−b)` is the largest difference between the "
    "two implementations and `max ULP apart` the largest number of representable values of the "
    "storage dtype between them (+0.0 and −0.0 one apart), over elements that are not NaN: a "
    "distance between the pair, not an error against fp64 (the accuracy table's `err ULP vs "
    "fp64` is that). Representable values crowd near zero, so where a sum cancels to almost "
    "nothing a small `max abs(a−b)` can be tens of thousands of ULPs apart (bf16 has 16,256 "
    "values in [0, 1), as many in (−1, −0]; a sign change crosses them all): read the two "
    "together."
)
_MAX_LISTED = 12
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


# --------------------------------------------------------------------------- per cell


@dataclass(frozen=True)
class PairResult:
    """One implementation pair and case of one cell: tensor name -> CMP."""

    cell: CellReport
    a: str
    b: str
    case: str
    tensors: dict[str, dict[str, Any]]

    @property
    def pair(self) -> str:
        return f"{self.a} vs {self.b}"


def _unordered_pairs(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Each unordered pair once, oriented ``non-baseline vs baseline``, else first seen."""
    baseline = data.get("baseline")
    seen: dict[frozenset[str], tuple[str, str]] = {}
    for impl, entry in data.get("results", {}).items():
        for key in entry:
            pair = frozenset((impl, key[3:]))
            if key.startswith("vs ") and pair not in seen:
                seen[pair] = (key[3:], impl) if impl == baseline else (impl, key[3:])
    return list(seen.values())


def pair_results(cell: CellReport, filters: Filters | None = None) -> list[PairResult]:
    """The cell's comparisons, each unordered pair once, cases in the report's order (only
    those of a dtype the filters keep)."""
    filters = filters or Filters()
    by_dtype = CaseFilter.of(filters)
    by_direction: dict[tuple[str, str], dict[str, Any]] = {}
    for row in iter_pairs(cell.data):
        by_direction.setdefault((row.impl, row.other), {})[row.case_id] = row.tensors
    out = []
    for a, b in _unordered_pairs(cell.data):
        if not filters.keeps_impl(a, b):
            continue
        forward, mirror = by_direction.get((a, b), {}), by_direction.get((b, a), {})
        # CMP figures are symmetric; a case only in the mirror direction is shown from it.
        cases = cell.in_order([*forward, *(c for c in mirror if c not in forward)])
        out += [PairResult(cell, a, b, c, forward.get(c, mirror.get(c, {})))
                for c in by_dtype.cases(cell, cases)]
    return out


def format_count(cmp: Mapping[str, Any] | None) -> str:
    """A CMP as the bitwise table shows it: ``equal``, ``differ/numel`` (``, nan k``), ``—``.

    Example:
        >>> format_count({"equal": False, "differ": 7, "numel": 9, "nan_differ": 2})
        '7/9, nan 2'
    """
    if cmp is None:
        return ABSENT
    if cmp.get("equal"):
        return "equal"
    nan = f", nan {cmp['nan_differ']}" if cmp.get("nan_differ") else ""
    return f"{cmp.get('differ')}/{cmp.get('numel')}{nan}"


def _apart(cmps: Mapping[str, Mapping[str, Any] | None], key: str) -> str:
    """``gate 0.125`` (``out 0.5; gate 2``): ``key`` of each tensor with a differing element
    that is not NaN, ``-`` where the report has none; :data:`ABSENT` when there is none."""
    parts = []
    for tensor, cmp in cmps.items():
        if cmp is None or cmp.get("equal") or cmp.get("nan_differ", 0) >= cmp.get("differ", 0):
            continue
        value = cmp.get(key)
        parts.append(f"{tensor} {'-' if value is None else num(value)}")
    return "; ".join(parts) or ABSENT


def bitwise_table(cells: Sequence[CellReport], filters: Filters | None = None) -> Table:
    """Per cell x pair x case: each tensor's CMP, and how far apart the differing tensors are.
    A cell without comparisons gets one row with its status, so no cell is dropped."""
    rows = []
    columns = report_tensors.columns(c.data for c in cells)
    for cell in cells:
        results = pair_results(cell, filters)
        for r in results:
            cmps = {t: r.tensors.get(t) for t in columns}
            rows.append(Row((cell.label, cell.status, r.pair, r.case, dtype_label(cell, r.case),
                             *map(format_count, cmps.values()), _apart(cmps, "max_abs"),
                             _apart(cmps, "max_ulp")),
                            cell.index, ("", status_kind(cell.status), "", "", "",
                                         *map(cmp_kind, cmps.values()))))
        if not results and not _unordered_pairs(cell.data):
            rows.append(Row((cell.label, cell.status, *[ABSENT] * (5 + len(columns))),
                            cell.index, ("", status_kind(cell.status))))
    return Table("bitwise", "Bitwise comparison per cell",
                 ("cell", "status", "pair", "case", "dtype", *columns, "max abs(a−b)",
                  "max ULP apart"), rows,
                 note=LEGEND.format(legend=report_tensors.legend(c.data for c in cells)),
                 empty="No reports.")


# --------------------------------------------------------------------------- across cells


@dataclass(frozen=True)
class AcrossRow:
    """Cells grouped by identical bits: ``groups`` holds (sha256, cell indexes) in first-seen
    order. For inputs, ``impl`` is ``"inputs"`` and ``tensor`` names the inputs that differ."""

    problem: str
    case: str
    impl: str
    tensor: str
    groups: tuple[tuple[str, tuple[int, ...]], ...]
    void: bool = False
    dtype: str | None = None  # the problem's storage dtype (the HTML page filters on it)

    @property
    def count(self) -> int:
        return sum(len(g) for _, g in self.groups)

    def verdict(self) -> str:
        if self.void:
            return "void: inputs differ"
        if self.count == 1:
            return "1 cell only"
        if len(self.groups) == 1:
            return f"identical ({self.count} cells)"
        return f"{len(self.groups)} variants ({self.count} cells)"

    def kind(self) -> str:
        if self.void:
            return "void"
        return "eq" if len(self.groups) == 1 and self.count > 1 else (
            "diff" if len(self.groups) > 1 else "")


@dataclass
class Across:
    """Everything :func:`across_cells` found; ``without`` lists cells with no bits and why."""

    problems: list[tuple[str, str, tuple[int, ...]]]
    inputs: list[AcrossRow]
    rows: list[AcrossRow]
    without: list[tuple[int, str]]

    @property
    def comparable(self) -> bool:
        """Whether at least two cells have bits (else there is nothing to compare)."""
        return sum(len(m) for _, _, m in self.problems) >= 2


def _group(members: list[tuple[str, int]]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    groups: dict[str, list[int]] = {}
    for key, index in members:
        groups.setdefault(key, []).append(index)
    return tuple((k, tuple(v)) for k, v in groups.items())


def _inputs_key(sha: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(dict(sorted(sha.items()))).encode()).hexdigest()


def across_cells(cells: Sequence[CellReport], filters: Filters | None = None) -> Across:
    """Group our cells by the sha256 of every (implementation, case, tensor) they produced.

    Example:
        >>> a = across_cells(load_cells(read_reports(Path("reports"))))
        >>> a.rows[0].verdict()
        'identical (2 cells)'
    """
    filters = filters or Filters()
    by_dtype = CaseFilter.of(filters)
    # problem -> cell index -> base case id -> the cell's own case id
    problems: dict[Problem, dict[int, dict[str, str]]] = {}
    by_index = {c.index: c for c in cells}
    without = []
    for cell in cells:
        has_bits = any((e.get("sha256") or {}) for e in cell.results.values())
        if not has_bits or not cell.data.get("problem"):
            why = ("foreign report: the reference layout has no sha256" if not cell.ours
                   else f"status {cell.status}" + (f": {text(cell.reason)}" if cell.reason
                                                   else ": no sha256 in the report"))
            without.append((cell.index, why))
            continue
        for case in by_dtype.cases(cell, cell.cases):
            key = case_problem(cell, case)
            assert key is not None  # the report has a problem (above)
            problems.setdefault(key, {}).setdefault(cell.index, {})[base_case(case)] = case
    across = Across([], [], [], without)
    several_ops = len({key[0] for key in problems}) > 1
    for n, (key, members) in enumerate(problems.items(), 1):
        label = f"P{n}"
        op, dtype, sizes, index_dtype, seed = key
        sized = "".join(f", {k}={v}" for k, v in sizes)
        across.problems.append((label, (f"{op}: " if several_ops else "")
                                + f"{dtype}{sized}, index {index_dtype}, seed {seed}",
                                tuple(members)))
        columns = report_tensors.columns(by_index[i].data for i in members)
        cases = case_order(b for own in members.values() for b in own)
        void = set()

        def own(index: int, base: str, members: dict[int, dict[str, str]] = members) -> str:
            """The cell's own id of case ``base``; "" where it has none."""
            return members[index].get(base, "")

        for case in cases:
            given = [(i, ((by_index[i].data.get("inputs") or {}).get(own(i, case)) or {})
                      .get("sha256")) for i in members if own(i, case)]
            shas: list[tuple[int, dict[str, str]]] = [(i, s) for i, s in given if s]
            if not shas:
                continue
            names = sorted({n for _, s in shas for n in s})
            differing = [n for n in names if len({s.get(n) for _, s in shas}) > 1]
            row = AcrossRow(label, case, "inputs", ", ".join(differing) or "all",
                            _group([(_inputs_key(s), i) for i, s in shas]), bool(differing),
                            dtype)
            across.inputs.append(row)
            if row.void:
                void.add(case)
        impls = list(dict.fromkeys(i for m in members for i in by_index[m].results))
        for impl in filter(filters.keeps_impl, impls):
            for case in cases:
                for tensor in columns:
                    found = [(s, i) for i in members if own(i, case)
                             and (s := (by_index[i].per_case(impl, "sha256", own(i, case))
                                        or {}).get(tensor))]
                    if found:
                        across.rows.append(AcrossRow(label, case, impl, tensor, _group(found),
                                                     case in void, dtype))
    return across


def _listing(row: AcrossRow, labels: Sequence[str]) -> str:
    if row.count == 1:
        return labels[row.groups[0][1][0]]
    if len(row.groups) == 1:
        return "all"
    parts = []
    for n, (_, members) in enumerate(row.groups):
        names = [labels[i] for i in members[:_MAX_LISTED]]
        more = f", +{len(members) - _MAX_LISTED} more" if len(members) > _MAX_LISTED else ""
        parts.append(f"{_LETTERS[n % 26]} ({len(members)}): {', '.join(names)}{more}")
    return " · ".join(parts)


NOTHING_TO_COMPARE = "Fewer than two of our cells have bits: nothing to compare across cells yet."


def _cells(n: int) -> str:
    return f"{n} cell" + ("" if n == 1 else "s")


def _inputs_verdict(row: AcrossRow) -> str:
    return row.verdict() if row.void or row.count == 1 else "agree"


def across_tables(across: Across, cells: Sequence[CellReport]) -> list[Table]:
    """The Markdown view of :func:`across_cells`: inputs, then outputs."""
    labels = [c.label for c in cells]
    problems = "; ".join(f"{p} = {t} ({_cells(len(m))})" for p, t, m in across.problems)
    without = "; ".join(f"{labels[i]} ({why})" for i, why in across.without)
    head = Table(
        "across", "Identical bits across cells", (),
        note="Our cells grouped by the sha256 of each tensor's bits, within one problem "
             "(op, dtype, sizes, index dtype, seed; " + (problems or "none") + "): first the "
             "inputs of each case, which must agree for the comparison to mean anything (where "
             "they differ, that case's rows are void), then each implementation's outputs. "
             "Groups are lettered in the order of the cells.")
    inputs = Table(
        "across-inputs", "Inputs", ("problem", "case", "inputs", "cells by identical bits"),
        [Row((r.problem, r.case, _inputs_verdict(r), _listing(r, labels)), None,
             ("", "", r.kind() if r.void else ("eq" if r.count > 1 else "")))
         for r in across.inputs if across.comparable],
        empty=NOTHING_TO_COMPARE, level=3)
    by_case: dict[tuple[str, str, str], dict[str, AcrossRow]] = {}
    for r in across.rows if across.comparable else []:
        by_case.setdefault((r.problem, r.impl, r.case), {})[r.tensor] = r
    rows = []
    columns = report_tensors.columns(c.data for c in cells if c.ours)
    for key, tensors in by_case.items():
        split: dict[str, list[str]] = {}
        for t, r in tensors.items():
            if len(r.groups) > 1:
                split.setdefault(_listing(r, labels), []).append(t)
        found = [tensors.get(t) for t in columns]
        rows.append(Row((*key, *(r.verdict() if r else ABSENT for r in found),
                         " / ".join(f"{', '.join(ts)}: {listing}" for listing, ts in split.items())
                         or ABSENT), None, ("", "", "", *(r.kind() if r else "absent"
                                                          for r in found))))
    outputs = Table(
        "across-outputs", "Outputs",
        ("problem", "impl", "case", *columns, "cells by identical bits, where they differ"),
        rows, empty=NOTHING_TO_COMPARE,
        footer=f"Cells without bits: {without}." if without else "", level=3)
    return [head, inputs, outputs]
