"""The status of a cell and of an implementation in it: one vocabulary.

A cell's ``status`` is one of :class:`Status`; an implementation's is one of
:data:`IMPL_STATUSES`. The report schema lists the same values
(``$defs/cell_status``, ``$defs/impl_status``; tests/test_status.py checks them). Members are
strings (``Status.OK == "ok"``), so reports stay plain JSON.

Example::

    >>> Status.OOM.failed, Status.MISMATCH.failed, f"{Status.SKIPPED}"
    (True, False, 'skipped')
    >>> worst([Status.OK, Status.MISMATCH, Status.OOM])
    <Status.OOM: 'oom'>
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class Status(str, Enum):
    """A cell's (or an implementation's) outcome, in the order the tables list them."""

    OK = "ok"
    MISMATCH = "mismatch"  # an implementation broke one of its bitwise claims
    ERROR = "error"
    OOM = "oom"
    TIMEOUT = "timeout"
    BUILD_ERROR = "build_error"  # a docker stack's image did not build
    SKIPPED = "skipped"  # the cell cannot run here (no GPU, no image, no case on its target)
    UNAVAILABLE = "unavailable"  # an implementation cannot run here (the reason says why)
    PARTIAL = "partial"  # a cell stopped with some cases done (the next run resumes it)

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def failed(self) -> bool:
        """Whether the run failed (error, oom, timeout, build_error), as opposed to a result
        (ok, mismatch) or a cell or implementation that did not run (skipped, unavailable)."""
        return self in _FAILED


_FAILED = frozenset({Status.ERROR, Status.OOM, Status.TIMEOUT, Status.BUILD_ERROR})

IMPL_STATUSES: tuple[Status, ...] = (Status.OK, Status.ERROR, Status.OOM, Status.UNAVAILABLE)
"""What an implementation's entry in a report may say."""

SEVERITY: dict[Status, int] = {Status.OK: 0, Status.UNAVAILABLE: 0, Status.MISMATCH: 1,
                               Status.ERROR: 2, Status.OOM: 2}
"""How a cell's implementations' statuses rank (the worst decides the cell's, runner.cell.run):
a failed implementation (2) makes the cell fail, a broken claim (1) a mismatch."""


def worst(statuses: Iterable[str]) -> Status:
    """The most severe of ``statuses`` by :data:`SEVERITY` (unknown ones rank 0; none: ok).
    Raises ``ValueError`` for a string that is no status."""
    found = [Status(s) for s in statuses]
    return max(found, key=lambda s: SEVERITY.get(s, 0), default=Status.OK)
