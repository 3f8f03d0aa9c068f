"""The host backend: each cell in a fresh ``python -m runner cell`` subprocess.

A fresh process per cell means a crash, a CUDA error that poisons the context, a hang or an
out-of-memory kill costs that cell only: the parent waits with a timeout, kills the whole
process group when it runs out, and when the child wrote no report of this run (checked by
``run_id``) writes one itself with status ``timeout``, ``oom`` or ``error``, the exit code
and the tail of the child's output (:func:`classify_failure`, :func:`failure_reason`: a bare
SIGKILL is ambiguous and the reason says what /proc/vmstat showed). Ctrl-C or SIGTERM in the
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
from pathlib import Path

from runner import lifetime
from runner import report as report_io
from runner.backends.interrupts import deferred
from runner.cell import skeleton
from runner.cells import cases_on
from runner.environment import PROJECT_ROOT
from runner.progress import PREFIX, ProgressView
from runner.staging import stopped_partial

LOG_TAIL_CHARS = 6000


def _tail(text: str, limit: int = LOG_TAIL_CHARS) -> str:
    return text if len(text) <= limit else "…" + text[-limit:]


def oom_kill_count() -> int | None:
    """The kernel's count of OOM-killer kills since boot (``oom_kill`` in /proc/vmstat,
    Linux >= 4.13, memory-cgroup kills included), or None where it cannot be read."""
    try:
        with open("/proc/vmstat", encoding="ascii") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def classify_failure(exit_code: int | None, log: str, timed_out: bool, *,
                     oom_kills: tuple[int | None, int | None] = (None, None)) -> str:
    """Status for a cell process that wrote no report: timeout, oom or error.

    ``oom`` needs evidence: an out-of-memory message in the log, or a SIGKILL while the
    kernel's OOM-kill count (``oom_kills``: before, after) grew. A bare SIGKILL is ``error``:
    the OOM killer, a user's ``kill -9`` and a container runtime all send it.
    """
    if timed_out:
        return "timeout"
    lowered = log.lower()
    if "out of memory" in lowered or "outofmemoryerror" in lowered:
        return "oom"
    before, after = oom_kills
    if exit_code == -signal.SIGKILL and None not in (before, after) and after > before:
        return "oom"
    return "error"


def failure_reason(exit_code: int | None, timed_out: bool, timeout_s: float, *,
                   oom_kills: tuple[int | None, int | None] = (None, None)) -> str:
    """One line saying how a cell process that wrote no report ended."""
    if timed_out:
        return (f"timed out: no report after the cell timeout of {timeout_s:g} s; the cell's "
                "process group was killed")
    if exit_code is None or exit_code >= 0:
        return f"cell process exited with code {exit_code} and wrote no report"
    name = _signal_name(-exit_code)
    reason = f"cell process was killed by {name} (exit code {exit_code}) and wrote no report"
    if exit_code != -signal.SIGKILL:
        return reason
    before, after = oom_kills
    if None in (before, after):
        return (f"{reason}; SIGKILL is ambiguous: the kernel's OOM killer or another process "
                "sent it (/proc/vmstat oom_kill unreadable: cannot tell which)")
    if after > before:
        return (f"{reason}; the kernel's OOM killer fired meanwhile (/proc/vmstat oom_kill "
                f"{before} -> {after}), so most likely out of memory")
    return (f"{reason}; not the runner's timeout and no OOM kill was recorded (/proc/vmstat "
            f"oom_kill stayed {before}): another process or a hard limit sent it")


def _read_lines(stream, lines: list[str], view: ProgressView) -> None:
    """Reader thread: keep every line of the cell's output, show its progress lines (and
    the watchdog's ``[cell]`` lines) as they come."""
    for line in stream:
        lines.append(line)
        text = line.rstrip("\n")
        if text.startswith((PREFIX, "[cell]")):
            view.feed(text)


def _kill_group(proc: subprocess.Popen) -> None:
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

    def fingerprint_extra(self, matrix, cell) -> dict:
        """What this backend adds to a cell's fingerprint: nothing (the host is the host)."""
        return {}

    def command(self, *, matrix_path: Path, cell, case_ids: list[str], reports_dir: Path,
                run_id: str) -> list[str]:
        """The child's argv: ``python -m runner cell ...`` (a list: no shell is involved)."""
        argv = [sys.executable, "-m", "runner", "cell", "--matrix", str(matrix_path),
                "--stack", cell.stack, "--mode", cell.mode, "--target", cell.target,
                "--reports", str(reports_dir), "--run-id", run_id]
        for case_id in case_ids:
            argv += ["--case", case_id]
        return argv

    def run(self, matrix, cell, cases, *, matrix_path: Path, reports_dir: Path, run_id: str,
            timeout_s: float) -> dict:
        """Run one cell; always returns the cell's report (also written under ``reports_dir``)."""
        from runner.cell import case_key

        case_ids = [str(case_key(c)) for c in cases]
        argv = self.command(matrix_path=matrix_path, cell=cell, case_ids=case_ids,
                            reports_dir=reports_dir, run_id=run_id)
        env = {**os.environ, **dict(matrix.modes[cell.mode].env), "PYTHONUNBUFFERED": "1",
               **lifetime.child_environment(timeout_s)}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
        started = time.perf_counter()
        kills_before = oom_kill_count()
        proc, timed_out, lines = None, False, []
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
        oom_kills = (kills_before, oom_kill_count())
        path = reports_dir / f"{cell.id}.json"
        loaded = report_io.read_report(path) if path.exists() else None
        status = classify_failure(proc.returncode, log, timed_out, oom_kills=oom_kills)
        reason = failure_reason(proc.returncode, timed_out, timeout_s, oom_kills=oom_kills)
        if loaded and loaded.data and loaded.data.get("run_id") == run_id:
            if loaded.data.get("status") != "partial":
                return loaded.data
            return stopped_partial(loaded.data, status, reason, exit_code=proc.returncode,
                                   log_tail=_tail(log))
        failed = skeleton(matrix, cell, cases, backend=self.name, run_id=run_id, status=status,
                          reason=reason)
        failed.update(exit_code=proc.returncode, log_tail=_tail(log),
                      duration_s=round(time.perf_counter() - started, 3))
        report_io.write_report(failed, reports_dir)
        return failed
