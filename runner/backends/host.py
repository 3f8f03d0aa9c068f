"""The host backend: each cell in a fresh ``python -m runner cell`` subprocess.

A fresh process per cell means a crash, a CUDA error that poisons the context, a hang or an
out-of-memory kill costs that cell only: the parent waits with a timeout, kills the whole
process group when it runs out, and when the child wrote no report of this run (checked by
``run_id``) writes one itself with status ``timeout``, ``oom`` or ``error``, the exit code
and the tail of the child's output (:mod:`runner.backends.failure`: a bare SIGKILL is
ambiguous and the reason says what /proc/vmstat showed). Ctrl-C or SIGTERM in the
parent (a ``KeyboardInterrupt``, :class:`runner.errors.Interrupted`) kills the cell's process
group before the interruption goes on; one that lands while the process starts is held until
its id is known (:func:`runner.backends.interrupts.deferred`). The mode's environment
variables are set in the child's environment before Python starts, so they are in place
before CUDA initialises.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from runner import lifetime
from runner import report as report_io
from runner.backends.base import cell_argv, failed_report
from runner.backends.failure import Ending, classify, explain, log_tail, oom_kill_count
from runner.backends.interrupts import deferred
from runner.cell import case_key
from runner.cells import Cell, cases_on
from runner.config import Case, Matrix
from runner.environment import PROJECT_ROOT
from runner.progress import PREFIX, ProgressView
from runner.staging import stopped_partial
from runner.status import Status


def _read_lines(stream: IO[str], lines: list[str], view: ProgressView) -> None:
    """Reader thread: keep every line of the cell's output, show its progress lines (and
    the watchdog's ``[cell]`` lines) as they come."""
    for line in stream:
        lines.append(line)
        text = line.rstrip("\n")
        if text.startswith((PREFIX, "[cell]")):
            view.feed(text)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the cell's process group (its own session), if it is still there (never a
    group id <= 0, which would name the caller's own group or every process)."""
    if proc.pid <= 0:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class HostBackend:
    """Runs cells with this interpreter, one subprocess per cell."""

    name = "host"

    def available(self) -> str | None:
        """None: the host can always run cells (targets are checked by the caller)."""
        return None

    def prepare(self, matrix: Matrix, stacks: Sequence[str], *,
                strict: bool) -> dict[str, str]:
        """Nothing to make ready: every stack routed here runs (``{}``)."""
        return {}

    def fingerprint_extra(self, matrix: Matrix, cell: Cell) -> dict[str, Any]:
        """What this backend adds to a cell's fingerprint: nothing (the host is the host)."""
        return {}

    def command(self, *, matrix_path: Path, cell: Cell, case_ids: Sequence[str],
                reports_dir: Path, run_id: str) -> list[str]:
        """The child's argv: :func:`runner.backends.base.cell_argv` with this interpreter."""
        return cell_argv(sys.executable, str(matrix_path), str(reports_dir), cell, case_ids,
                         run_id)

    def run(self, matrix: Matrix, cell: Cell, cases: Sequence[Case], *, matrix_path: Path,
            reports_dir: Path, run_id: str, timeout_s: float) -> dict[str, Any]:
        """Run one cell; always returns the cell's report (also written under ``reports_dir``)."""
        case_ids = [str(case_key(c)) for c in cases]
        argv = self.command(matrix_path=matrix_path, cell=cell, case_ids=case_ids,
                            reports_dir=reports_dir, run_id=run_id)
        env = {**os.environ, **dict(matrix.modes[cell.mode].env), "PYTHONUNBUFFERED": "1",
               **lifetime.child_environment(timeout_s)}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
        started = time.perf_counter()
        kills_before = oom_kill_count()
        proc: subprocess.Popen[str] | None = None
        timed_out = False
        lines: list[str] = []
        with ProgressView(cell.id, len(cases_on(cases, cell.target))) as view:
            try:
                with deferred():  # a Ctrl-C or SIGTERM during the start lands once proc is known
                    proc = subprocess.Popen(argv, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True, env=env,
                                            cwd=PROJECT_ROOT, start_new_session=True,
                                            errors="replace",
                                            preexec_fn=lifetime.die_with_parent)
                reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines, view),
                                          name=f"cell-output-{cell.id}", daemon=True)
                reader.start()
                try:
                    proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    _kill_group(proc)
                    proc.wait()
                reader.join(timeout=30)
            except BaseException:  # Ctrl-C or SIGTERM in the parent: leave no orphan behind
                if proc is not None:
                    _kill_group(proc)
                    proc.wait()
                raise
        log = "".join(lines)
        ending = Ending(proc.returncode, log, timed_out,
                        oom_kills=(kills_before, oom_kill_count()))
        path = reports_dir / f"{cell.id}.json"
        loaded = report_io.read_report(path) if path.exists() else None
        status, reason = classify(ending), explain(ending, timeout_s)
        if loaded and loaded.data and loaded.data.get("run_id") == run_id:
            if loaded.data.get("status") != Status.PARTIAL:
                return loaded.data
            return stopped_partial(loaded.data, status, reason, exit_code=proc.returncode,
                                   log_tail=log_tail(log))
        return failed_report(matrix, cell, cases, backend=self.name, run_id=run_id,
                             reports_dir=reports_dir, status=status, reason=reason,
                             started=started, exit_code=proc.returncode, log_tail=log_tail(log))
