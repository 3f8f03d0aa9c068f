"""Determinism across processes: a cell's process run in A-B-B-A order against another mode.

Cell A (mode A) and its partner B (same stack and target, mode B) each run in two fresh
processes, in the order A, B, B, A, so that whatever one process leaves behind (caches,
autotuning, a warm GPU) meets the other mode in between. Each mode's two reports are merged
into one: the first process's report, plus per implementation, case and tensor
``results[impl]["repeatable_across_processes"][case][tensor]``: whether the two processes'
sha256 were identical (None where either process has no bits for it). The order and the
run ids are recorded under ``environment.abba``.

Example (the command line)::

    python -m gate_residual_matrix matrix --stack host --mode plain --target cpu \
        --abba deterministic
"""

from __future__ import annotations

import copy
import tempfile
import uuid
from pathlib import Path

from gate_residual_matrix.runner.plan.cells import Cell


def across(first: dict, second: dict) -> dict:
    """``{impl: {case: {tensor: bool | None}}}`` from two reports of one cell."""
    out: dict = {}
    for impl, entry in (first.get("results") or {}).items():
        mine = entry.get("sha256") or {}
        theirs = ((second.get("results") or {}).get(impl) or {}).get("sha256") or {}
        out[impl] = {case: {t: (h == theirs[case][t] if t in (theirs.get(case) or {}) else None)
                            for t, h in tensors.items()}
                     for case, tensors in mine.items()}
    return out


def merge(first: dict, second: dict, order: list[str], run_ids: list[str]) -> dict:
    """``first`` with ``repeatable_across_processes`` against ``second`` and
    ``environment.abba`` (order, run ids, the statuses of the four processes' reports)."""
    merged = copy.deepcopy(first)
    for impl, cases in across(first, second).items():
        merged["results"][impl]["repeatable_across_processes"] = cases
    merged.setdefault("environment", {})["abba"] = {
        "order": order, "run_ids": run_ids,
        "second_process": {"run_id": second.get("run_id"), "status": second.get("status"),
                           "reason": second.get("reason")}}
    return merged


def run_abba(backend, matrix, cell_a: Cell, mode_b: str, cases, *, matrix_path: Path,
             reports_dir: Path, timeout_s: float) -> tuple[dict, dict]:
    """Run A, B, B, A (fresh processes) and return the merged reports of A and of B.

    The four runs write into a temporary directory under ``reports_dir``; the caller
    writes the two merged reports.
    """
    cell_b = Cell(cell_a.stack, mode_b, cell_a.target, cell_a.prefix)
    order = [cell_a, cell_b, cell_b, cell_a]
    reports, run_ids = [], []
    with tempfile.TemporaryDirectory(prefix=".abba-", dir=reports_dir) as tmp:
        for i, cell in enumerate(order):
            where = Path(tmp) / str(i)
            where.mkdir()
            run_ids.append(uuid.uuid4().hex)
            reports.append(backend.run(matrix, cell, cases, matrix_path=matrix_path,
                                       reports_dir=where, run_id=run_ids[-1],
                                       timeout_s=timeout_s))
    ids = [c.id for c in order]
    return (merge(reports[0], reports[3], ids, run_ids),
            merge(reports[1], reports[2], ids, run_ids))
