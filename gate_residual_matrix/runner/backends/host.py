"""The host backend: each cell in a fresh ``python -m gate_residual_matrix cell`` subprocess.

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

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from gate_residual_matrix.contract import gpu_lock
from gate_residual_matrix.runner.backends import lifetime, shards
from gate_residual_matrix.runner.backends.base import cell_argv, failed_report
from gate_residual_matrix.runner.backends.failure import (
    Ending,
    classify,
    explain,
    log_tail,
    oom_kill_count,
)
from gate_residual_matrix.runner.backends.interrupts import deferred
from gate_residual_matrix.runner.backends.staging import stopped_partial
from gate_residual_matrix.runner.cell.environment import PROJECT_ROOT, available_cpus
from gate_residual_matrix.runner.cell.progress import PREFIX, ProgressView, ShardTally
from gate_residual_matrix.runner.cell.run import case_key, now_utc
from gate_residual_matrix.runner.config.matrix import Case, Matrix
from gate_residual_matrix.runner.plan.cells import Cell, cases_on
from gate_residual_matrix.runner.reports import store as report_io
from gate_residual_matrix.runner.status import Status


def _read_lines(stream: IO[str], lines: list[str], view: ProgressView,
               translate: Callable[[str], str] | None = None) -> None:
    """Reader thread: keep every line of the cell's output, show its progress lines (and
    the watchdog's ``[cell]`` lines) as they come (``translate``: a shard's progress line
    made the cell's, :class:`runner.cell.progress.ShardTally`)."""
    for line in stream:
        lines.append(line)
        text = line.rstrip("\n")
        if text.startswith((PREFIX, "[cell]")):
            view.feed(translate(text) if translate else text)


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
        """Run one cell; always returns the cell's report (also written under ``reports_dir``).

        A cell of several shards (:func:`runner.backends.shards.count`) runs as that many processes
        at once, each writing into ``reports_dir/shard-<i>/``, on one GPU lock
        (``$GATE_RESIDUAL_GPU_LOCK``, else one in ``reports_dir``), each with its share of
        the CPUs for its threads and compile workers unless those are set; their reports
        are combined (:func:`runner.backends.shards.combine`). A stopped or failed shard costs its
        own cases only.
        """
        on_target = cases_on(cases, cell.target)
        cpus = available_cpus()
        n = shards.count(matrix, on_target, cell.target, cpus) if on_target else 1
        parts = shards.split(matrix, on_target, n) if n > 1 else [list(cases)]
        env = {**os.environ, **dict(matrix.modes[cell.mode].env), "PYTHONUNBUFFERED": "1",
               **lifetime.child_environment(timeout_s)}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
        dirs = [reports_dir]
        if len(parts) > 1:
            env.setdefault(gpu_lock.ENV, str(reports_dir / "gpu.lock"))
            share = str(max((cpus or 1) // len(parts), 1))
            for var in ("OMP_NUM_THREADS", "GATE_RESIDUAL_PRECOMPILE"):
                env.setdefault(var, share)
            dirs = [reports_dir / f"shard-{i + 1}" for i in range(len(parts))]
            for d in dirs:
                d.mkdir(exist_ok=True)
        planned = shards.planned_ids(parts)
        if len(parts) > 1:  # for a later run, should this runner die (runner/backends/staging.py)
            (reports_dir / shards.PLAN_FILE).write_text(
                json.dumps({"cell": cell.id, "shards": planned}), encoding="utf-8")
        started, started_at = time.perf_counter(), now_utc()
        kills_before = oom_kill_count()
        children: list[_Child] = []
        tally = ShardTally(cell.id, [len(p) for p in parts]) if len(parts) > 1 else None
        with ProgressView(cell.id, len(on_target)) as view:
            try:
                for i, ids in enumerate(planned):
                    argv = self.command(matrix_path=matrix_path, cell=cell, case_ids=ids,
                                        reports_dir=dirs[i], run_id=run_id)
                    translate = None if tally is None else functools.partial(tally.line, i)
                    with deferred():  # a Ctrl-C or SIGTERM during the start lands once known
                        children.append(_Child.start(argv, env, view, translate,
                                                     f"cell-output-{cell.id}-{i + 1}"))
                for child in children:
                    child.wait_until(started + timeout_s)
            except BaseException:  # Ctrl-C or SIGTERM in the parent: leave no orphan behind
                for child in children:
                    child.kill()
                if len(parts) > 1:  # what the shards finished, as the stage's partial report
                    found = [_written(d, cell.id, run_id) or shards.NOTHING_WRITTEN
                             for d in dirs]
                    if any(r.get("inputs") for r in found):
                        report_io.write_report(shards.combine(
                            found, planned, matrix, wall_s=time.perf_counter() - started),
                            reports_dir)
                raise
        oom_kills = (kills_before, oom_kill_count())
        reports = [self._outcome(matrix, cell, [c for c in cases if str(case_key(c)) in ids],
                                 child, dirs[i], run_id, timeout_s, started, oom_kills)
                   for i, (child, ids) in enumerate(zip(children, planned, strict=True))]
        if len(parts) == 1:
            return reports[0]
        combined = shards.combine(reports, planned, matrix,
                                  wall_s=time.perf_counter() - started, started_at=started_at,
                                  finished_at=now_utc())
        report_io.write_report(combined, reports_dir)
        return combined

    def _outcome(self, matrix: Matrix, cell: Cell, cases: Sequence[Case], child: _Child,
                 reports_dir: Path, run_id: str, timeout_s: float, started: float,
                 oom_kills: tuple[int | None, int | None]) -> dict[str, Any]:
        """A finished process's report: the one it wrote in this run, a ``partial`` one with
        how it ended, or a failed report (:mod:`runner.backends.failure`)."""
        log = "".join(child.lines)
        code = child.proc.returncode
        ending = Ending(code, log, child.timed_out, oom_kills=oom_kills)
        status, reason = classify(ending), explain(ending, timeout_s)
        written = _written(reports_dir, cell.id, run_id)
        if written is not None:
            if written.get("status") != Status.PARTIAL:
                return written
            return stopped_partial(written, status, reason, exit_code=code,
                                   log_tail=log_tail(log))
        return failed_report(matrix, cell, cases, backend=self.name, run_id=run_id,
                             reports_dir=reports_dir, status=status, reason=reason,
                             started=started, exit_code=code, log_tail=log_tail(log))


def _written(reports_dir: Path, cell_id: str, run_id: str) -> dict[str, Any] | None:
    """The report the cell process of ``run_id`` wrote in ``reports_dir``, or None."""
    path = reports_dir / f"{cell_id}.json"
    loaded = report_io.read_report(path) if path.exists() else None
    if loaded and loaded.data and loaded.data.get("run_id") == run_id:
        return loaded.data
    return None


class _Child:
    """One cell process in its own session, and the thread that reads its output."""

    def __init__(self, proc: subprocess.Popen[str], reader: threading.Thread,
                 lines: list[str]) -> None:
        self.proc, self.reader, self.lines = proc, reader, lines
        self.timed_out = False

    @classmethod
    def start(cls, argv: list[str], env: dict[str, str], view: ProgressView,
              translate: Callable[[str], str] | None, name: str) -> _Child:
        """Start ``argv`` and its reader thread (lines to ``view``, through ``translate``)."""
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, cwd=PROJECT_ROOT, start_new_session=True,
                                errors="replace", preexec_fn=lifetime.die_with_parent)
        lines: list[str] = []
        reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines, view, translate),
                                  name=name, daemon=True)
        reader.start()
        return cls(proc, reader, lines)

    def wait_until(self, deadline: float) -> None:
        """Wait for the process until ``deadline`` (``time.perf_counter()``); past it, kill
        its process group (``timed_out``). Then let the reader drain its output."""
        try:
            self.proc.wait(timeout=max(deadline - time.perf_counter(), 0.0))
        except subprocess.TimeoutExpired:
            self.timed_out = True
            self.kill()
        self.reader.join(timeout=30)

    def kill(self) -> None:
        """SIGKILL its process group and reap it."""
        _kill_group(self.proc)
        self.proc.wait()
