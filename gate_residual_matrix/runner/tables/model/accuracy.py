"""The accuracy and determinism table: each implementation against fp64, and its bits repeated.

:func:`accuracy_table`: per cell, implementation, case and tensor: error against fp64
(``results[impl].accuracy``), repeatable within a process (``repeatable``), across processes
(``repeatable_across_processes``) and batch-invariant (``batch_invariant``); the last two may
be absent from a report and then show ``—``. On the rows of a gradient with one row per index
value, the fewest and most rows per index value (``inputs[case].index_counts``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gate_residual_matrix.runner.reports import tensors as report_tensors
from gate_residual_matrix.runner.tables.model.cases import CaseFilter, dtype_label, index_rows
from gate_residual_matrix.runner.tables.model.cells import CellReport
from gate_residual_matrix.runner.tables.model.filters import Filters
from gate_residual_matrix.runner.tables.model.table import Row, Table
from gate_residual_matrix.runner.tables.model.values import ABSENT, num, text

__all__ = ["accuracy_table", "grouped_labels"]


def _yes_no(value: Any) -> str:
    """A determinism verdict: bool, or an object of named checks (all must hold)."""
    if value is None:
        return ABSENT
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, Mapping):
        checks = {k: v for k, v in value.items() if isinstance(v, bool)}
        if not checks:
            return ABSENT
        failed = [k for k, v in checks.items() if not v]
        size = value.get("first_failing_size")
        detail = ", ".join(failed) + (f"; first failing size {size}" if size is not None else "")
        return "yes" if not failed else f"NO ({detail})"
    return text(value)


def _batch_invariant(entry: Mapping[str, Any], case: str, tensor: str) -> str:
    """``batch_invariant``: a bool, {check: bool}, or either per case and/or per tensor."""
    value = entry.get("batch_invariant")
    if isinstance(value, Mapping) and case in value:
        value = value[case]
    if isinstance(value, Mapping) and tensor in value:
        value = value[tensor]
    return _yes_no(value)


def _kind(verdict: str) -> str:
    return "eq" if verdict == "yes" else ("diff" if verdict.startswith("NO") else "")


def _index_rows(cell: CellReport, case: str, grouped: set[str], tensor: str) -> str:
    """``min–max`` rows per index value of the case, on the rows of the tensors with one row
    per index value (``grouped``) only."""
    found = index_rows(cell, case) if tensor in grouped else None
    return ABSENT if found is None else f"{found[0]}–{found[1]}"


def _grouped(cell: CellReport) -> set[str]:
    """The report's tensors with one row per index value (shape[0] is the index's size)."""
    groups = report_tensors.index_groups(cell.data)
    return {k for k, v in report_tensors.table(cell.data).items()
            if (v.get("shape") or [None])[0] == groups}


def accuracy_table(cells: Sequence[CellReport], filters: Filters | None = None) -> Table:
    """Per cell x implementation x case x tensor: error vs fp64 and the determinism checks;
    on a per-index-value gradient's rows, the fewest and most rows that one of its rows sums."""
    filters = filters or Filters()
    by_dtype = CaseFilter.of(filters)
    rows: list[Row] = []
    without: list[str] = []
    for cell in cells:
        before = len(rows)
        names, grouped = report_tensors.labels(cell.data), _grouped(cell)
        for impl, entry in cell.results.items():
            if not filters.keeps_impl(impl):
                continue
            acc = entry.get("accuracy") or {}
            rep = entry.get("repeatable") or {}
            across = entry.get("repeatable_across_processes") or {}
            keys = list(dict.fromkeys([*acc, *rep, *across]))
            cases = cell.in_order(keys)
            for case in by_dtype.cases(cell, cases):
                figures = report_tensors.flat(acc.get(case))
                for tensor in names:
                    fig = figures.get(tensor) or {}
                    verdicts = [_yes_no((rep.get(case) or {}).get(tensor)),
                                _yes_no((across.get(case) or {}).get(tensor)),
                                _batch_invariant(entry, case, tensor)]
                    if not fig and verdicts[:2] == [ABSENT, ABSENT]:
                        continue
                    ulps = fig.get("max_abs_ulps")
                    over = ulps == "inf" or (isinstance(ulps, (int, float)) and ulps > 1)
                    rows.append(Row((cell.label, impl, case, dtype_label(cell, case), tensor,
                                     num(fig.get("max_abs")), num(fig.get("max_rel")), num(ulps),
                                     _index_rows(cell, case, grouped, tensor), *verdicts),
                                    cell.index,
                                    ("",) * 7 + ("warn" if over else "", "")
                                    + tuple(map(_kind, verdicts))))
        if len(rows) == before and cell.ours:
            without.append(f"{cell.label} ({cell.status})")
    return Table(
        "accuracy", "Accuracy vs fp64 and determinism",
        ("cell", "impl", "case", "dtype", "tensor", "max_abs", "max_rel", "err ULP vs fp64",
         "rows per index", "repeatable", "across processes", "batch-invariant"), rows,
        note="Each implementation against the float64 reference: `max_abs`, `max_rel` "
             "(over elements with a non-zero reference) and `err ULP vs fp64` (`max_abs_ulps`: "
             "max_abs in ULPs of the storage dtype at the largest |reference|; above 1 is marked "
             "in the HTML page; not the bitwise table's `max ULP apart`, a distance between two "
             "implementations). `rows per index`, on a gradient with one row per index value "
             "(an AdaLN row's: " + (grouped_labels(cells) or "none") + "): the fewest and "
             "most rows of the case that share one index value (`inputs[case]."
             "index_counts`), which one of its elements sums, so its error grows with them. "
             "`repeatable`: the same bits in every repeat within one process; `across "
             "processes`: the same bits in separate processes; `batch-invariant`: rows "
             "computed alone, in sub-batches and in the full batch agree. `—`: the report "
             "has no such figure.",
        empty="No accuracy figures.",
        footer=f"Cells without figures: {'; '.join(without)}." if without else "")


def grouped_labels(cells: Sequence[CellReport]) -> str:
    """The labels of the per-index-value gradients of the cells' ops (``grad_gate``)."""
    found: dict[str, None] = {}
    for cell in cells:
        names = report_tensors.labels(cell.data)
        found.update(dict.fromkeys(f"`{names[k]}`" for k in sorted(_grouped(cell))))
    return ", ".join(found)
