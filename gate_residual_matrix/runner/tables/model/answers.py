"""The headline's answer, per op: a grid that fits one screen, and (:mod:`.sentence`) one sentence
that answers "can I swap A for B?".

Per op, the grid's rows are the op's implementation pairs (as in
:mod:`runner.tables.model.headline`, without the op's name) and its columns GPU × stack ×
modes: the modes of one GPU × stack whose marks are the same, mark for mark, share one column,
which names them (``plain, tf32``; its errors are the largest of those modes'). Each mark
carries the two sides' largest error against the accuracy reference (fp64), in ULP
(``results[impl].accuracy[case][tensor].max_abs_ulps``), over the tensors and cases where the
pair differs (over every tensor and case where it does not: then the two are the same), so a
reader sees which side is closer to the truth, not only that they differ; and ``⚠`` where one
of the reports it sums up was not made at the current commit, was made from a dirty tree, or
has a status other than ok (per report: :attr:`OpGrid.warnings` names each such report and
why).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gate_residual_matrix import ops
from gate_residual_matrix.runner.reports import tensors as report_tensors
from gate_residual_matrix.runner.tables.model.bits import pair_results
from gate_residual_matrix.runner.tables.model.cells import CellReport
from gate_residual_matrix.runner.tables.model.filters import Filters
from gate_residual_matrix.runner.tables.model.headline import (
    Mark,
    cell_marks,
    gpu_label,
    stack_label,
    staleness,
)
from gate_residual_matrix.runner.tables.model.values import ABSENT

__all__ = ["GRID_LEGEND",
    "MODE_ORDER",
    "GridColumn",
    "GridMark",
    "OpGrid",
    "base",
    "cell_stats",
    "names",
    "op_grids",
    "ulp",
]

MODE_ORDER = ("plain", "deterministic", "inference", "tf32", "vllm_batch_invariant",
              "sglang_ieee")
"""Modes in the order a column names them (others after, sorted)."""
WARN = "⚠"


def ulp(value: float | None) -> str:
    """An error in ULP for display: three significant digits (``0.5``, ``17.7``, ``3.1e+04``),
    :data:`ABSENT` when unknown."""
    return ABSENT if value is None else f"{value:.3g}"


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


@dataclass
class Stats:
    """One pair's figures beyond the mark: each side's largest error vs fp64 in ULP over the
    tensors and cases where they differ (``err_diff``) and over all (``err_all``), and the
    largest number of representable values apart of a differing element (``apart``)."""

    err_diff: list[float | None] = field(default_factory=lambda: [None, None])
    err_all: list[float | None] = field(default_factory=lambda: [None, None])
    apart: int | None = None

    def add(self, other: Stats) -> None:
        for mine, theirs in ((self.err_diff, other.err_diff), (self.err_all, other.err_all)):
            for i in (0, 1):
                mine[i] = _max(mine[i], theirs[i])
        if other.apart is not None:
            self.apart = max(self.apart or 0, other.apart)


def _error(cell: CellReport, impl: str, case: str, tensor: str) -> float | None:
    figures = report_tensors.flat(cell.per_case(impl, "accuracy", case)).get(tensor)
    value = figures.get("max_abs_ulps") if isinstance(figures, dict) else None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def cell_stats(cell: CellReport, filters: Filters | None = None) -> dict[str, Stats]:
    """pair (``"a vs b"``, oriented and named as :func:`headline.cell_marks` names it, without
    the op) -> :class:`Stats` over the cell's cases."""
    out: dict[str, Stats] = {}
    baseline = cell.data.get("baseline")
    for r in pair_results(cell, filters):
        a, b = (r.b, r.a) if r.a in ("eager", "diffusers") and not baseline else (r.a, r.b)
        stats = out.setdefault(f"{a} vs {b}", Stats())
        for tensor, cmp in r.tensors.items():
            if not cmp:
                continue
            errors = [_error(cell, a, r.case, tensor), _error(cell, b, r.case, tensor)]
            differ = not cmp.get("equal") and (cmp.get("nan_payload_differ") or 0) < (
                cmp.get("differ") or 0)
            for i in (0, 1):
                stats.err_all[i] = _max(stats.err_all[i], errors[i])
                if differ:
                    stats.err_diff[i] = _max(stats.err_diff[i], errors[i])
            if differ and isinstance(cmp.get("max_ulp"), int):
                stats.apart = max(stats.apart or 0, cmp["max_ulp"])
    return out


@dataclass
class GridMark:
    """One pair in one grid column: the headline's :class:`Mark`, its :class:`Stats`, and
    the staleness notes of the reports it sums up."""

    mark: Mark
    stats: Stats
    warnings: list[str] = field(default_factory=list)

    def errors(self) -> tuple[float | None, float | None]:
        """(candidate, baseline) error vs fp64 in ULP, over what differs (else over all)."""
        e = self.stats.err_diff if self.mark.differ else self.stats.err_all
        return e[0], e[1]

    def closer(self) -> int | None:
        """0 when the first side is closer to fp64 (as shown), 1 the second, None: a tie or
        unknown."""
        a, b = (ulp(e) for e in self.errors())
        if ABSENT in (a, b) or a == b:
            return None
        ea, eb = self.errors()
        return 0 if (ea or 0.0) < (eb or 0.0) else 1

    def error_text(self) -> str:
        """``0.5 | 17.7`` (each side's error), ``0.5`` (same bits: one error), ``""``."""
        a, b = (ulp(e) for e in self.errors())
        if self.mark.compared and not self.mark.differ:
            return a if a != ABSENT else ""
        return "" if a == b == ABSENT else f"{a} | {b}"

    def text(self) -> str:
        """The mark, its errors after ``·``, and ``⚠``: ``✗ gate 97% NR · 0.5 | 17.7 ⚠``."""
        label = self.mark.label()
        errors = self.error_text() if self.mark.compared else ""
        return " ".join(x for x in (label, f"· {errors}" if errors else "",
                                    WARN if self.warnings else "") if x)


@dataclass
class GridColumn:
    """One column of an op's grid: GPU, stack, the modes it stands for, their cells."""

    gpu: str
    stack: str
    modes: list[str]
    cells: list[CellReport]

    @property
    def foreign(self) -> bool:
        return not any(c.ours for c in self.cells)


@dataclass
class OpGrid:
    """One op's grid: ``pairs`` × ``columns`` -> ``marks[(pair, n)]``; ``warnings``:
    ``(report label, why)`` for each stale or not-ok report in it; ``sentence``: the answer
    (:func:`runner.tables.model.sentence.op_sentence`)."""

    op: str
    pairs: list[str]
    columns: list[GridColumn]
    marks: dict[tuple[str, int], GridMark]
    warnings: list[tuple[str, str]]
    sentence: str = ""


def _warning(cell: CellReport, head: str | None) -> str:
    notes = [staleness(cell, head)] + ([cell.status] if cell.ours and cell.status != "ok"
                                         else [])
    return "; ".join(n for n in notes if n)


def _mode_key(mode: str) -> tuple[int, str]:
    return (MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), mode)


def _merged(cells: Sequence[CellReport], filters: Filters | None,
            head: str | None) -> dict[str, GridMark]:
    """pair -> the worst :class:`GridMark` over ``cells`` (one mode's cells)."""
    out: dict[str, GridMark] = {}
    for cell in cells:
        suffix = f" ({cell.op})"
        stats = cell_stats(cell, filters)
        note = _warning(cell, head)
        for pair, mark in cell_marks(cell, filters).items():
            pair = pair.removesuffix(suffix)
            grid = out.setdefault(pair, GridMark(Mark(), Stats()))
            grid.mark.add(mark)
            grid.stats.add(stats.get(pair, Stats()))
            if note and mark.compared:
                grid.warnings.append(f"{cell.label}: {note}")
    return out


def _columns(cells: Sequence[CellReport], filters: Filters | None, head: str | None,
             ) -> tuple[list[GridColumn], list[dict[str, GridMark]]]:
    """The op's columns, modes with the same marks collapsed, and their marks."""
    groups: dict[tuple[str, str], dict[str, list[CellReport]]] = {}
    for cell in cells:
        key = (gpu_label(cell), stack_label(cell))
        groups.setdefault(key, {}).setdefault(cell.facet("mode"), []).append(cell)
    order = sorted(groups, key=lambda k: (k[0] == "CPU", not any(
        c.ours for m in groups[k].values() for c in m), k))
    columns: list[GridColumn] = []
    marks: list[dict[str, GridMark]] = []
    for gpu, stack in order:
        seen: dict[tuple[tuple[str, str], ...], int] = {}
        for mode in sorted(groups[(gpu, stack)], key=_mode_key):
            mode_cells = groups[(gpu, stack)][mode]
            merged = _merged(mode_cells, filters, head)
            signature = tuple(sorted((p, m.mark.label()) for p, m in merged.items()))
            if signature in seen:
                n = seen[signature]
                columns[n].modes.append(mode)
                columns[n].cells += mode_cells
                for pair, grid in merged.items():  # every mode counts (its comparisons too)
                    marks[n][pair].warnings += grid.warnings
                    marks[n][pair].mark.add(grid.mark)
                    marks[n][pair].stats.add(grid.stats)
                continue
            seen[signature] = len(columns)
            columns.append(GridColumn(gpu, stack, [mode], list(mode_cells)))
            marks.append(merged)
    return columns, marks


def op_grids(cells: Sequence[CellReport], filters: Filters | None = None,
             head: str | None = None) -> list[OpGrid]:
    """One :class:`OpGrid` per op with comparisons, in the order of :data:`ops.OPS`.

    Example:
        >>> [g.op for g in op_grids(load_cells(read_reports(Path("reports"))))][:2]
        ['gate_residual', 'indexed_scale_shift']
    """
    by_op: dict[str, list[CellReport]] = {}
    for cell in cells:
        if any(m.compared for m in cell_marks(cell, filters).values()):
            by_op.setdefault(cell.op or ops.OPS[0], []).append(cell)
    out = []
    for op in sorted(by_op, key=lambda o: (o not in ops.OPS, ops.OPS.index(o)
                                          if o in ops.OPS else 0, o)):
        columns, marks = _columns(by_op[op], filters, head)
        pairs = list(dict.fromkeys(p for m in marks for p in m))
        grid = {(p, n): m[p] for n, m in enumerate(marks) for p in m}
        warnings = list(dict.fromkeys(
            (c.label, w) for c in by_op[op] if (w := _warning(c, head))))
        out.append(OpGrid(op, pairs, columns, grid, warnings))
    return out


def base(impl: str) -> tuple[str, str]:
    """``("vllm_x", "0.30.0")`` of a versioned library row ``vllm_x-0.30.0``; else
    ``(impl, "")``."""
    name, _, version = impl.rpartition("-")
    return (name, version) if name and version[:1].isdigit() else (impl, "")


def names(impls: Iterable[str]) -> list[str]:
    """Implementation names, each library's versions joined and variants that differ in
    their last word braced: ``["liger_x_llama-0.8.4", "liger_x_none-0.8.4", "numba"]`` ->
    ``["liger_x_{llama,none} 0.8.4", "numba"]``."""
    versions: dict[str, list[str]] = {}
    for impl in impls:
        name, version = base(impl)
        found = versions.setdefault(name, [])
        if version and version not in found:
            found.append(version)
    grouped: dict[tuple[str, str], list[str]] = {}
    for name, found in versions.items():
        stem, _, last = name.rpartition("_")
        key = (stem, "/".join(found)) if stem and found else (name, "/".join(found))
        grouped.setdefault(key, []).append(last if stem and found else "")
    out = []
    for (stem, joined), lasts in grouped.items():
        word = (f"{stem}_{{{','.join(lasts)}}}" if len(lasts) > 1 else
                f"{stem}_{lasts[0]}" if lasts[0] else stem)
        out.append(f"{word} {joined}" if joined else word)
    return out


GRID_LEGEND = (
    "Each grid: one row per pair of the op, one column per GPU × stack × the modes whose marks "
    "are all the same (named in the column). A mark reads as in the full table; after `·` each "
    "side's largest error against fp64 in ULP (`candidate | baseline`, over the tensors and "
    "cases where they differ; one number where the bits are the same; the largest over the "
    "column's modes); the closer side in bold. ⚠: one of the reports the mark sums up was not "
    "made at the current commit, was made from a dirty tree, or is not ok; each is named under "
    "its grid.")
"""How to read a grid (Markdown; the page renders the code spans)."""
