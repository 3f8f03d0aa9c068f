"""What a matrix run says about each cell: a typed :class:`CellOutcome` per selected cell.

The pipeline (:mod:`runner.pipeline`) returns one outcome per cell; the command line prints
:func:`summary` and exits 5 when :func:`failed` finds any. An outcome's status is a report
status (:class:`~runner.status.Status`), or :data:`REFUSED`: a ``--case`` run that would have
mixed its cases into a report of other code or another machine, which is kept as it was (no
report says ``refused``).

Example::

    >>> o = CellOutcome("host-plain-cpu", Status.OOM, "out of memory", Path("r.json"))
    >>> [x.cell for x in failed([o])], f"{o.status}"
    (['host-plain-cpu'], 'oom')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tabulate import tabulate

from gate_residual_matrix.runner.status import Status

__all__ = ["REFUSED", "SHOWN_CELLS", "CellOutcome", "OutcomeStatus", "failed",
           "outcome_status", "skipped_lines", "summary"]

REFUSED: Literal["refused"] = "refused"
"""The outcome of a ``--case`` run refused (:func:`runner.reports.merge.plan_partial`)."""

OutcomeStatus = Status | Literal["refused"]
"""A cell's outcome: its report's status, or :data:`REFUSED`."""


@dataclass(frozen=True)
class CellOutcome:
    """One row of the run summary: the cell's id, its status, why (or None), its report's
    path, whether an existing report was reused (not run again) and, for a skipped cell whose
    file holds an earlier run's report, the end of ``reason`` that says which report was kept
    (``kept``: ``; kept the existing ok report (NVIDIA H200, ...)``; else None)."""

    cell: str
    status: OutcomeStatus
    reason: str | None
    path: Path
    reused: bool = False
    kept: str | None = None


def outcome_status(value: str) -> OutcomeStatus:
    """``value`` (a report's ``status``, or ``"refused"``) as an :data:`OutcomeStatus`.

    Raises ``ValueError`` for a string that is neither."""
    return REFUSED if value == REFUSED else Status(value)


SHOWN_CELLS = 3
"""How many cell ids a skipped-reason line names before "+N more"."""


def skipped_lines(outcomes: Sequence[CellOutcome]) -> list[str]:
    """One line per reason the ``skipped`` outcomes were skipped for (their ``kept`` ends
    left out, the kept reports counted): ``6 cells (a, b, c, +3 more): no GPU (5 with their
    earlier reports kept)``."""
    by_reason: dict[str, list[str]] = {}
    kept: dict[str, int] = {}
    for o in outcomes:
        if o.status == Status.SKIPPED:
            full = o.reason or "no reason given"
            reason = full.removesuffix(o.kept) if o.kept else full
            by_reason.setdefault(reason, []).append(o.cell)
            kept[reason] = kept.get(reason, 0) + bool(o.kept)
    lines = []
    for reason, cells in by_reason.items():
        named = ", ".join(cells[:SHOWN_CELLS]) + (
            f", +{len(cells) - SHOWN_CELLS} more" if len(cells) > SHOWN_CELLS else "")
        held = (f" ({'its' if len(cells) == 1 else f'{kept[reason]} with their'} earlier "
                f"report{'s' * (kept[reason] > 1)} kept)") if kept[reason] else ""
        lines.append(f"{len(cells)} cell{'' if len(cells) == 1 else 's'} ({named}): "
                     f"{reason}{held}")
    return lines


REASON_WIDTH = 100
"""The summary table's reason column wraps at this many characters (a partial cell's reason
names each shard's; the report keeps it whole)."""


def summary(outcomes: Sequence[CellOutcome]) -> str:
    """What a person reads after a run: a line of counts, one line per reason cells were
    skipped for, then a table (cell, status, reason) of only the cells that are neither ok
    nor skipped, its reasons wrapped at :data:`REASON_WIDTH` characters. Example::

        48 cells: 2 ok (1 reused), 45 skipped, 1 error
        skipped: 40 cells (cpu-torch2.13-plain-cpu, ..., +37 more): no Docker engine: ...
        cell             status    reason
        ---------------  --------  --------
        host-plain-cuda  error     ...
    """
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[f"{o.status}"] = counts.get(f"{o.status}", 0) + 1
    order = ["ok", "skipped"] + [f"{s}" for s in Status if s not in (Status.OK, Status.SKIPPED)]
    order.append(REFUSED)
    reused = sum(o.reused for o in outcomes if o.status == Status.OK)
    parts = [f"{counts[s]} {s}" + (f" ({reused} reused)" if s == "ok" and reused else "")
             for s in sorted(counts, key=order.index)]
    lines = [f"{len(outcomes)} cell{'' if len(outcomes) == 1 else 's'}: "
             + (", ".join(parts) or "none selected")]
    lines += [f"skipped: {line}" for line in skipped_lines(outcomes)]
    rows = [(o.cell, f"{o.status}", o.reason or "") for o in failed(outcomes)]
    if rows:
        lines.append(tabulate(rows, headers=("cell", "status", "reason"), tablefmt="simple",
                              maxcolwidths=[None, None, REASON_WIDTH]))
    return "\n".join(lines)


def failed(outcomes: Sequence[CellOutcome]) -> list[CellOutcome]:
    """Outcomes whose status is neither ok nor skipped (``refused`` included: a partial run
    that would have mixed its cases into a report of other code or another machine)."""
    return [o for o in outcomes if o.status not in (Status.OK, Status.SKIPPED)]
