"""The host backend: each cell in a fresh ``python -m runner cell`` subprocess.

A fresh process per cell means a crash, a CUDA error that poisons the context, a hang or an
out-of-memory kill costs that cell only: the parent waits with a timeout, kills the whole
process group when it runs out, and when the child wrote no report of this run (checked by
``run_id``) writes one itself with status ``timeout``, ``oom`` or ``error``, the exit code
and the tail of the child's output. The mode's environment variables are set in the child's
environment before Python starts, so they are in place before CUDA initialises.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from runner import report as report_io
from runner.cell import skeleton
from runner.environment import PROJECT_ROOT

LOG_TAIL_CHARS = 6000


def _tail(text: str, limit: int = LOG_TAIL_CHARS) -> str:
    return text if len(text) <= limit else "…" + text[-limit:]


def classify_failure(exit_code: int | None, log: str, timed_out: bool) -> str:
    """Status for a cell process that wrote no report: timeout, oom or error."""
    if timed_out:
        return "timeout"
    lowered = log.lower()
    if "out of memory" in lowered or "outofmemoryerror" in lowered or exit_code == -signal.SIGKILL:
        return "oom"
    return "error"


class HostBackend:
    """Runs cells with this interpreter, one subprocess per cell."""

    name = "host"

    def available(self) -> str | None:
        """None: the host can always run cells (targets are checked by the caller)."""
        return None

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
        env = {**os.environ, **dict(matrix.modes[cell.mode].env), "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, cwd=PROJECT_ROOT, start_new_session=True)
        timed_out = False
        try:
            log, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            log, _ = proc.communicate()
        log = log or ""
        path = reports_dir / f"{cell.id}.json"
        loaded = report_io.read_report(path) if path.exists() else None
        if loaded and loaded.data and loaded.data.get("run_id") == run_id:
            return loaded.data
        status = classify_failure(proc.returncode, log, timed_out)
        reason = (f"no report after {timeout_s:g} s: killed" if timed_out else
                  f"cell process exited with code {proc.returncode} and wrote no report")
        failed = skeleton(matrix, cell, cases, backend=self.name, run_id=run_id, status=status,
                          reason=reason)
        failed.update(exit_code=proc.returncode, log_tail=_tail(log),
                      duration_s=round(time.perf_counter() - started, 3))
        report_io.write_report(failed, reports_dir)
        return failed
