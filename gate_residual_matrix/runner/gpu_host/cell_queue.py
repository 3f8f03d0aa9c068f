"""The ``modes`` step's cells, several at once: each one a runner process from the queue.

With ``--jobs`` above 1 every cell runs as its own ``python -m gate_residual_matrix matrix``
process (one file, one mode, the host stack, the run's target and cases, ``--no-tables``),
started by :func:`runner.gpu_host.schedule.run_queue` when its shards fit in the CPUs left.
A process per cell, not a thread, because a cell's runner owns process-wide things: its
locks on the reports folder, its signal handlers (an interruption writes the finished cases
as a ``partial`` report), its environment. Each process gets, in its environment only, the
one GPU lock file every cell shares (each case's timing loops alone on the GPU) and
:data:`THREADS` threads for torch and numba.

What a cell ended as is read from its report (``OUT/reports/<cell id>.json``); a runner that
exited without one is an ``error`` naming its exit code. An interruption of the step (Ctrl-C,
SIGTERM) starts no further cell and sends SIGTERM to every running one, waits up to
:data:`GRACE_S` for them to write their reports, then kills what is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from gate_residual_matrix.runner.gpu_host.steps import TIMEOUT_RC, HostRun

THREADS = 2
"""torch's and numba's threads in each cell process when cells run at once."""
GRACE_S = 60.0
"""After an interruption, how long running cells get to write their partial reports."""


class Running:
    """The cell processes started and not yet ended, for :meth:`interrupt`."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self.stopping = False

    def add(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._procs.append(proc)

    def remove(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._procs.remove(proc)

    def interrupt(self) -> None:
        """SIGTERM to every running cell's runner (it stops its shards and writes what they
        finished), then, after :data:`GRACE_S`, SIGKILL to the process groups still there."""
        self.stopping = True
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        for proc in procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def argv(run: HostRun, path: Path, mode: str, reports: Path, timeout_s: float,
         cases: list[str] | None) -> list[str]:
    """The runner command of one cell (see the module docstring)."""
    out = [sys.executable, "-m", "gate_residual_matrix", "matrix", "--matrix", str(path),
           "--reports", str(reports), "--stack", "host", "--mode", mode, "--target",
           run.target, "--backend", "host", "--timeout", f"{max(timeout_s, 1.0):.0f}",
           "--no-tables"]
    for case in cases or []:
        out += ["--case", case]
    return out


def spawn(run: HostRun, command: list[str], env: dict, running: Running) -> int:
    """Run one cell's runner (its output where the step's goes) until it ends or the run's
    deadline passes; its exit code (:meth:`HostRun.finish`)."""
    proc = run.start(command, env=env)
    running.add(proc)
    try:
        return run.finish(proc)
    finally:
        running.remove(proc)


def outcome(reports: Path, cell: str, rc: int, since: float | None = None):
    """The :class:`runner.outcome.CellOutcome` of a cell whose runner exited ``rc``, from its
    report: the report's status and reason; ``error`` when there is no readable report (one
    stopped at the run's deadline before its first case says so), or when the runner failed
    (not 0, nor 5: a cell that did not end ok) and the report says ok: the report is an
    earlier run's, or, when it was written at or after ``since`` (the runner's start, Unix
    seconds), the runner failed after writing it. A runner stopped at the run's deadline
    after it wrote an ``ok`` report keeps that status (its cell had ended)."""
    from gate_residual_matrix.runner.outcome import CellOutcome, outcome_status
    from gate_residual_matrix.runner.reports import store
    from gate_residual_matrix.runner.status import Status

    path = reports / f"{cell}.json"
    loaded = store.read_report(path) if path.is_file() else None
    data = loaded.data if loaded is not None else None
    if not data or data.get("status") is None:
        if loaded is None and rc == TIMEOUT_RC:
            return CellOutcome(cell, Status.ERROR, "stopped at the run's deadline before its "
                               "first case ended (no report); the next run runs it whole",
                               path)
        why = loaded.problem if loaded is not None else "none was written"
        return CellOutcome(cell, Status.ERROR, f"the cell's runner exited {rc}; its report: "
                           f"{why}", path)
    status = outcome_status(str(data["status"]))
    if status == Status.OK and rc not in (0, 5):
        fresh = since is not None and path.stat().st_mtime >= since
        if fresh and rc == TIMEOUT_RC:
            return CellOutcome(cell, status, data.get("reason"), path)
        return CellOutcome(cell, Status.ERROR, f"the cell's runner exited {rc}; " + (
            "after writing this report" if fresh else "the report there is an earlier run's"),
            path)
    return CellOutcome(cell, status, data.get("reason"), path)


def environment(run: HostRun, budget_mib: int | None = None) -> dict:
    """What every cell process gets over the step's environment: the GPU lock file (under
    the project's ``build/`` unless one is set), :data:`THREADS` threads and, with
    ``budget_mib``, the GPU memory the cells share case by case (:mod:`contract.gpu_budget`)."""
    from gate_residual_matrix.contract import gpu_budget, gpu_lock

    lock = Path(os.environ.get(gpu_lock.ENV) or run.root / "build" / "gpu.lock").resolve()
    lock.parent.mkdir(parents=True, exist_ok=True)
    return {gpu_lock.ENV: str(lock), "OMP_NUM_THREADS": str(THREADS),
            "NUMBA_NUM_THREADS": str(THREADS),
            **({gpu_budget.ENV: str(budget_mib)} if budget_mib else {})}


def timeline_entries(done: list, offset: float) -> list[dict]:
    """The timeline's entry of each unit: its times since the step began (null for a cell
    that was not started), CPUs and statuses (``not started`` for one without an outcome)."""
    out = []
    for u in done:
        outcomes = u.result[0] if u.result else []
        ran = bool(outcomes) and u.started_s is not None and u.ended_s is not None
        out.append({"cell": u.name, "cpus": u.cpus, "memory_mib": u.memory,
                    "start_s": round(offset + u.started_s, 1) if ran else None,
                    "end_s": round(offset + u.ended_s, 1) if ran else None,
                    "status": [f"{o.status}" for o in outcomes] or ["not started"]})
    return out
