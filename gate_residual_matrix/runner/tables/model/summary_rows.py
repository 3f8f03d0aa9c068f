"""The flat rows of ``summary.csv`` and ``summary.json``: one per cell x implementation x case
x tensor (:data:`COLUMNS`), typed (numbers, booleans, None).

Each row has the case's dtypes (:mod:`runner.tables.model.cases`) and fewest and most rows
per index value, the tensor's sha256, its comparison with the cell's baseline (or, in a
foreign report, the implementation it was compared with), its accuracy against fp64, the
determinism verdicts and the case's median times (repeated on each tensor's row). A cell with
no results has one row with its status and reason and empty implementation columns (its
problem's dtypes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from gate_residual_matrix.runner.reports import tensors as report_tensors
from gate_residual_matrix.runner.tables.model.build import Tables
from gate_residual_matrix.runner.tables.model.cases import CaseFilter, case_dtypes, index_rows
from gate_residual_matrix.runner.tables.model.cells import CellReport

__all__ = ["COLUMNS", "summary_rows"]

COLUMNS = (
    "cell", "origin", "op", "stack", "mode", "target", "dtype", "index_dtype", "gpu", "status",
    "reason", "impl", "impl_status", "case", "index_rows_min", "index_rows_max", "tensor",
    "sha256", "vs", "equal", "differ", "numel",
    "vs_max_abs", "vs_max_ulp", "max_abs", "max_rel", "max_abs_ulps", "rel_l2", "repeatable",
    "repeatable_across_processes", "forward_ms", "forward_backward_ms",
)


def _partner(cell: CellReport, impl: str, entry: dict[str, Any]) -> str | None:
    baseline = cell.data.get("baseline")
    if impl != baseline and f"vs {baseline}" in entry:
        return str(baseline)
    return next((k[3:] for k in entry if k.startswith("vs ")), None)


def _case_of(entry: dict[str, Any], key: str, case: str) -> dict[str, Any]:
    return (entry.get(key) or {}).get(case) or {}


def _cell_rows(cell: CellReport, keeps_impl: Callable[..., bool],
               by_dtype: CaseFilter) -> Iterator[dict[str, Any]]:
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
            figures = report_tensors.flat(acc)
            cmp_case = compared.get(case) or {}
            cmps = report_tensors.flat(cmp_case)
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
    :class:`~runner.tables.model.build.Tables`: the CSV and the JSON share them)."""
    cached = tables.cache.get("summary_rows")
    if cached is None:
        cached = tables.cache["summary_rows"] = [
            row for cell in tables.cells
            for row in _cell_rows(cell, tables.filters.keeps_impl, CaseFilter.of(tables.filters))]
    return cached
