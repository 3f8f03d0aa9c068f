"""The whole job's time left: one estimate across every matrix file a ``matrix`` command runs
(every op's, by default), shown on the line each cell starts with::

    [runner] cell rms_norm-host-plain-cpu: running 3 case(s) on host; job: 4 of 7 cells
    done, elapsed 2 min 52 s, about 1 min 58 s left

Where the figures come from: each cell's previous report in the reports folder (its
``duration_s``, from whichever machine made it), scaled by how this run's finished cells
compared with theirs (their seconds now over their seconds then). A guide only, never a
result: a cell without a previous report adds nothing (the line says how many), and a
report that cannot be read counts as none.

Which cells it counts: before the first file runs, :func:`planned` lists every selected
cell on a target this host has (``cuda`` only with a GPU) of a ``kind: host`` stack (and of
docker stacks with ``--backend docker``); as each file's cells are decided (skipped, reused
or run: :func:`runner.run.run_cells`), those that will not run are dropped and those that
will are added. One clock per process (:func:`start`); a cluster's cells run at once, so
a cluster run keeps none.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from gate_residual_matrix.runner.cell.progress import duration

__all__ = ["JobClock", "drop", "expect", "planned", "previous_seconds", "start", "starting"]

MAX_REPORT_BYTES = 64 << 20
"""A previous report larger than this is not read for its time (reports are far smaller)."""

_CLOCK: JobClock | None = None


def previous_seconds(reports_dir: Path, cell_id: str) -> float | None:
    """``duration_s`` of the cell's previous report in ``reports_dir`` when it ran cases
    (``ok``, ``partial``, ``mismatch``), else None (no report, unreadable, too large, or
    one that ran nothing)."""
    path = Path(reports_dir) / f"{cell_id}.json"
    try:
        if not path.is_file() or path.stat().st_size > MAX_REPORT_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("status") not in ("ok", "partial", "mismatch"):
        return None
    seconds = data.get("duration_s")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        return None
    return float(seconds)


class JobClock:
    """The cells a job will run, each with its previous time (seconds, or None), and the
    time since the job began (``now``: a monotonic clock in seconds, for tests)."""

    def __init__(self, expected: dict[str, float | None], now=time.monotonic) -> None:
        self.expected = dict(expected)
        self.now = now
        self.began = now()
        self.started: list[str] = []

    def expect(self, cell_id: str, seconds: float | None) -> None:
        """``cell_id`` will run (added if it was not counted)."""
        self.expected.setdefault(cell_id, seconds)

    def drop(self, cell_id: str) -> None:
        """``cell_id`` will not run (skipped, reused, refused)."""
        if cell_id not in self.started:
            self.expected.pop(cell_id, None)

    def starting(self, cell_id: str) -> str:
        """``cell_id`` starts now (the cells started before it have finished): the job's
        line, ``job: 4 of 7 cells done, elapsed 2 min 52 s, about 1 min 58 s left``."""
        self.expect(cell_id, None)
        elapsed = self.now() - self.began
        done = [c for c in self.started if c in self.expected]
        self.started.append(cell_id)
        then = [self.expected[c] for c in done]
        scale = elapsed / sum(then) if then and None not in then and sum(then) > 0 else 1.0
        ahead = [self.expected[c] for c in self.expected if c not in done]
        known = [s for s in ahead if s is not None]
        line = (f"job: {len(done)} of {len(self.expected)} cells done, elapsed "
                f"{duration(elapsed)}")
        if known:
            line += f", about {duration(sum(known) * scale)} left"
        unknown = len(ahead) - len(known)
        if unknown:
            line += (f" (+{unknown} cell{'s' * (unknown > 1)} without a previous report's "
                     "time)")
        return line


def planned(cells: Iterable[tuple[str, bool]], reports_dir: Path) -> dict[str, float | None]:
    """``{cell id: previous seconds}`` of the cells given as ``(cell id, counted)``, the
    counted ones only."""
    return {cid: previous_seconds(reports_dir, cid) for cid, counted in cells if counted}


@contextmanager
def start(expected: dict[str, float | None]) -> Iterator[JobClock]:
    """This process's clock while the job runs."""
    global _CLOCK
    _CLOCK = JobClock(expected)
    try:
        yield _CLOCK
    finally:
        _CLOCK = None


def expect(cell_id: str, seconds: float | None) -> None:
    """:meth:`JobClock.expect` on the running clock, if any."""
    if _CLOCK is not None:
        _CLOCK.expect(cell_id, seconds)


def drop(cell_id: str) -> None:
    """:meth:`JobClock.drop` on the running clock, if any."""
    if _CLOCK is not None:
        _CLOCK.drop(cell_id)


def starting(cell_id: str) -> str:
    """``; job: ...`` for the line a cell starts with, or ``""`` without a clock."""
    return "" if _CLOCK is None else f"; {_CLOCK.starting(cell_id)}"
