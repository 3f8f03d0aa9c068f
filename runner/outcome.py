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

from runner.status import Status

__all__ = ["REFUSED", "CellOutcome", "OutcomeStatus", "failed", "outcome_status", "summary"]

REFUSED: Literal["refused"] = "refused"
"""The outcome of a ``--case`` run refused (:func:`runner.merge.plan_partial`)."""

OutcomeStatus = Status | Literal["refused"]
"""A cell's outcome: its report's status, or :data:`REFUSED`."""


@dataclass(frozen=True)
class CellOutcome:
    """One row of the run summary: the cell's id, its status, why (or None), its report's
    path and whether an existing report was reused (not run again)."""

    cell: str
    status: OutcomeStatus
    reason: str | None
    path: Path
    reused: bool = False


def outcome_status(value: str) -> OutcomeStatus:
    """``value`` (a report's ``status``, or ``"refused"``) as an :data:`OutcomeStatus`.

    Raises ``ValueError`` for a string that is neither."""
    return REFUSED if value == REFUSED else Status(value)


def summary(outcomes: Sequence[CellOutcome]) -> str:
    """A plain-text table of the run's cells: id, status, reason."""
    rows = [(o.cell, f"{o.status}" + (" (reused)" if o.reused else ""), o.reason or "")
            for o in outcomes]
    return tabulate(rows, headers=("cell", "status", "reason"), tablefmt="simple")


def failed(outcomes: Sequence[CellOutcome]) -> list[CellOutcome]:
    """Outcomes whose status is neither ok nor skipped (``refused`` included: a partial run
    that would have mixed its cases into a report of other code or another machine)."""
    return [o for o in outcomes if o.status not in (Status.OK, Status.SKIPPED)]
