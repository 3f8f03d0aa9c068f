"""Staging directories, stopped cells and their resume.

A backend runs a cell into a hidden staging directory ``reports/.run-<run id>/``; the cell
writes a ``partial`` report there after each case (:func:`runner.cell.run.run_cell`), and the
runner puts the final report in place. When the cell stops before its end (its timeout, a
crash, Ctrl-C, SIGTERM, SIGHUP, the runner killed, the machine gone), its last ``partial``
report is what is kept:

* the runner salvages it from the stage on its way out (:func:`salvage`), or, when the
  runner itself died, the next run does (:func:`clean_stale`: a stage whose owner process is
  gone, per its ``owner.json``);
* :func:`keep_partial` writes it to ``reports/<cell>.json`` unless that holds an ``ok``
  report of the same fingerprint (a ``--force`` re-run that was stopped loses nothing);
* the next run of the same cell with the same fingerprint runs only ``cases_missing``
  (:func:`resumable`) and merges the two (:func:`combine`).

:func:`run_staged` runs one cell through a backend that way.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gate_residual_matrix.runner.cell import phases
from gate_residual_matrix.runner.config.matrix import Case, Matrix
from gate_residual_matrix.runner.errors import ReportError
from gate_residual_matrix.runner.plan.cells import Cell
from gate_residual_matrix.runner.reports import store as report_io
from gate_residual_matrix.runner.reports.merge import MACHINE_KEYS, merge_reports
from gate_residual_matrix.runner.status import Status
from gate_residual_matrix.runner.untrusted.files import locked

if TYPE_CHECKING:
    from gate_residual_matrix.runner.backends.base import Backend

OWNER = "owner.json"
PLAN_FILE = "shards.json"
"""A sharded cell's plan in its stage (written by the host backend:
:mod:`runner.backends.shards`)."""
_FAILED_WITH_DATA = ("ok", "mismatch", "error", "oom", "partial")


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22),
    which tells a live process from a later one that reuses its pid; None if unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def open_stage(reports_dir: Path, run_id: str, *, fingerprint: str | None = None) -> Path:
    """Create ``reports_dir/.run-<run_id>/`` with an ``owner.json`` naming this process and
    the ``fingerprint`` the runner stamps on the cell's report (so that a later run can
    resume a partial report salvaged from here)."""
    stage = reports_dir / f".run-{run_id}"
    try:
        stage.mkdir()
    except OSError as err:  # e.g. --reports /proc/1: the folder exists, nothing goes in it
        raise ReportError(f"{reports_dir}: cannot create a staging folder in it: "
                          f"{err.strerror or err}") from err
    owner = {"pid": os.getpid(), "start": _start_time(os.getpid()), "host": socket.gethostname(),
             "fingerprint": fingerprint}
    (stage / OWNER).write_text(json.dumps(owner), encoding="utf-8")
    return stage


def owner_alive(stage: Path) -> bool:
    """Whether the process that made ``stage`` still runs (on this host). A stage of another
    host, or without a readable owner, counts as alive unless it is more than a day old."""
    try:
        owner = json.loads((stage / OWNER).read_text(encoding="utf-8"))
        pid, start, host = int(owner["pid"]), owner.get("start"), owner.get("host")
    except (OSError, ValueError, KeyError, TypeError):
        return _age_s(stage) < 86400
    if host != socket.gethostname():
        return _age_s(stage) < 86400
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return start is None or _start_time(pid) == start


def _age_s(path: Path) -> float:
    import time

    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


def _with_cases(data: dict | None) -> bool:
    """Whether a report read from a stage holds cases worth keeping: a ``partial`` one, or a
    finished one (the cell ended and its runner was stopped before it put it in place)."""
    return bool(data and data.get("status") in _FAILED_WITH_DATA and data.get("cases"))


def salvage(stage: Path, cell_id: str) -> dict | None:
    """The report a stopped cell left in ``stage`` (``partial``, or its final report when
    only the runner was stopped after the cell's end), or None."""
    path = stage / f"{cell_id}.json"
    if not path.is_file():
        return None
    loaded = report_io.read_report(path)
    return loaded.data if _with_cases(loaded.data) else None


def keep_partial(partial: dict, reports_dir: Path) -> Path | None:
    """Write ``partial`` (fingerprint stamped) to ``reports_dir/<cell>.json`` unless that
    already holds an ``ok`` report of the same fingerprint; the path written, or None."""
    path = reports_dir / f"{partial['cell']['id']}.json"
    if path.exists():
        existing = report_io.read_report(path).data or {}
        if (existing.get("status") == "ok"
                and existing.get("fingerprint") == partial.get("fingerprint")):
            return None
    return report_io.write_report(partial, reports_dir)


def _shard_reports(stage: Path, matrix) -> list[dict]:
    """The report of a sharded cell whose runner died before it combined its shards'
    (:mod:`runner.backends.shards`: ``shards.json`` in the stage names each shard's cases, and
    ``shard-<i>/`` holds what the shard wrote), or nothing."""
    from gate_residual_matrix.runner.backends import shards

    try:
        plan = json.loads((stage / PLAN_FILE).read_text(encoding="utf-8"))
        cell_id, planned = plan["cell"], plan["shards"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    found = []
    for i in range(len(planned)):
        path = stage / f"shard-{i + 1}" / f"{cell_id}.json"
        data = report_io.read_report(path).data if path.is_file() else None
        found.append(data if data is not None else shards.NOTHING_WRITTEN)
    if not any(_with_cases(d) for d in found):
        return []
    return [shards.combine(found, planned, matrix, wall_s=0.0)]


def clean_stale(reports_dir: Path, matrix=None) -> list[tuple[Path, list[dict]]]:
    """Remove the staging directories of runs that are gone, returning each with the
    reports found in it (:func:`salvage`'s kinds), stamped with the fingerprint its runner
    recorded (None if it recorded none); not yet written: the caller keeps them. With
    ``matrix``, a sharded cell's shards are combined first (:func:`runner.backends.shards.combine`).
    """
    out = []
    for stage in sorted(reports_dir.glob(".run-*")):
        if not stage.is_dir() or stage.is_symlink() or owner_alive(stage):
            continue
        try:
            stamp = json.loads((stage / OWNER).read_text(encoding="utf-8")).get("fingerprint")
        except (OSError, ValueError, AttributeError):
            stamp = None
        found = []
        reports: list[dict | None] = [report_io.read_report(path).data
                                      for path in sorted(stage.glob("*.json"))
                                      if path.name not in (OWNER, PLAN_FILE)]
        if not any(_with_cases(d) for d in reports) and matrix is not None:
            reports = list(_shard_reports(stage, matrix))
        for data in reports:
            if data is None or not _with_cases(data):
                continue
            if data.get("status") != "partial":  # finished: its own reason stands
                found.append({**data, "fingerprint": stamp})
                continue
            found.append({**data, "fingerprint": stamp,
                          "reason": "stopped with its runner (the runner died); the next "
                                    "run of this cell runs only the missing cases"})
        shutil.rmtree(stage, ignore_errors=True)
        out.append((stage, found))
    return out


def resumable(path: Path, expected_fingerprint: str,
              expected_cases: set[str] | None = None) -> dict | None:
    """The ``partial`` report at ``path`` when it is of ``expected_fingerprint`` and lists
    missing cases: the next run runs only those. None otherwise, and also when
    ``expected_cases`` (the selection's case ids) is not exactly its ``cases`` and
    ``cases_missing`` together (an edited or foreign report is run again, never trusted)."""
    if not path.is_file():
        return None
    data = report_io.read_report(path).data
    if not (data and data.get("status") == "partial" and data.get("cases_missing")
            and data.get("fingerprint") == expected_fingerprint):
        return None
    done = [str(c) for c in data.get("cases") or []]
    missing = [str(c) for c in data["cases_missing"]]
    if expected_cases is not None and (set(done) & set(missing)
                                       or set(done) | set(missing) != expected_cases
                                       or set(done) != set(data.get("inputs") or {})):
        return None
    return data


def stopped_partial(partial: dict, status: str, reason: str, *, exit_code: int | None,
                    log_tail: str | None) -> dict:
    """A cell that wrote a ``partial`` report after some cases and then stopped (its
    timeout, a crash, a kill): that report, with how the process ended in its reason, its
    exit code and log tail. Its status stays ``partial``: the next run of the cell runs only
    the missing cases."""
    done, missing = len(partial.get("cases") or []), len(partial.get("cases_missing") or [])
    return {**partial, "exit_code": exit_code, "log_tail": log_tail,
            "reason": (f"stopped after {done} of {done + missing} cases ({status}: {reason}); "
                       "the next run of this cell runs only the missing ones")}


def _machine(report: dict) -> dict:
    env = report.get("environment") or {}
    return {k: env.get(k) for k in MACHINE_KEYS if k != "project"}


def combine(old: dict, new: dict, matrix) -> dict:
    """A resumed cell's report: ``old`` (partial) and ``new`` (the run of its missing cases).

    * ``new`` gave no case (it failed before its first): ``old``, with why in its reason.
    * ``new`` ran on another machine or stack (:data:`runner.reports.merge.MACHINE_KEYS`): ``new``
      alone, as a partial whose missing cases are ``old``'s too: never mixed.
    * else the merge (:func:`runner.reports.merge.merge_reports`): ``partial`` while cases are still
      missing; an implementation that failed in either part keeps its failure and the cell
      its status; phase times and durations add up.
    """
    new_cases = [str(c) for c in new.get("cases") or []] if new.get("inputs") else []
    if new.get("status") not in _FAILED_WITH_DATA or not new_cases:
        return {**old, "reason": f"{old.get('reason')}; the resume ran no case: "
                                 f"{new.get('status')}: {new.get('reason')}",
                "log_tail": new.get("log_tail"), "exit_code": new.get("exit_code")}
    if "torch" in (new.get("environment") or {}) and _machine(old) != _machine(new):
        missing = [*(new.get("cases_missing") or []), *old["cases"]]
        return {**new, "status": "partial", "cases_missing": missing,
                "reason": "resumed on another machine or stack than the stopped run's: its "
                          f"{len(old['cases'])} case(s) are missing again (not mixed)"}
    merged = merge_reports(old, new, matrix)
    for name, entry in merged["results"].items():
        before = (old.get("results") or {}).get(name) or {}
        if before.get("status") in ("error", "oom") and entry.get("status") == "ok":
            entry.update(status=before["status"], reason=before.get("reason"))
    merged["started_at"] = old.get("started_at", merged.get("started_at"))
    merged["duration_s"] = round((old.get("duration_s") or 0) + (new.get("duration_s") or 0), 3)
    merged["phases"] = phases.add(old.get("phases"), new.get("phases"))
    if new.get("status") == "partial":
        merged["status"], merged["cases_missing"] = "partial", list(new["cases_missing"])
        return merged
    merged.pop("cases_missing", None)
    failed = {n: e for n, e in merged["results"].items() if e.get("status") in ("error", "oom")}
    if failed and merged["status"] in ("ok", "mismatch"):
        merged["status"] = next(iter(failed.values()))["status"]
        merged["reason"] = "; ".join(f"{n}: {e.get('reason')}" for n, e in failed.items())
    return merged


def run_staged(backend: Backend, matrix: Matrix, cell: Cell, cases: Sequence[Case],
               resume: dict | None, *, matrix_path: Path, reports_dir: Path, run_id: str,
               timeout_s: float, stamp: Callable[[dict], dict]) -> dict:
    """Run ``cases`` of ``cell`` through ``backend`` (a
    :class:`runner.backends.base.Backend`) into a staging directory and return the report
    stamped by ``stamp`` (the runner's fingerprint) and merged into ``resume``, the stopped
    run's partial report, if any.

    When the run is interrupted (Ctrl-C, SIGTERM, SIGHUP), the partial report the cell left
    in the stage is kept (:func:`keep_partial`) before the interruption goes on; the stage
    is always removed.
    """
    stage = open_stage(reports_dir, run_id, fingerprint=stamp({})["fingerprint"])
    try:  # the backend writes only in the stage; the report goes in place afterwards, whole
        result = backend.run(matrix, cell, cases, matrix_path=matrix_path, reports_dir=stage,
                             run_id=run_id, timeout_s=timeout_s)
    except BaseException:
        _keep_interrupted(stage, cell.id, resume, matrix, reports_dir, stamp)
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    result = stamp(result)
    return result if resume is None else combine(resume, result, matrix)


def _keep_interrupted(stage: Path, cell_id: str, resume: dict | None, matrix: Matrix,
                      reports_dir: Path, stamp: Callable[[dict], dict]) -> None:
    """Keep the report an interrupted cell left in ``stage``, stamped and merged into
    ``resume``, and say so."""
    partial = salvage(stage, cell_id)
    if partial is None:
        return
    partial = stamp(partial)
    if resume is not None:
        partial = combine(resume, partial, matrix)
    with locked(reports_dir):
        kept = keep_partial(partial, reports_dir)
    if kept is None:
        return
    if partial.get("status") == Status.PARTIAL:
        print(f"\n[runner] cell {cell_id}: kept {len(partial['cases'])} finished "
              "case(s) as a partial report; the next run resumes it", flush=True)
    else:  # the cell had ended: only its runner was stopped
        print(f"\n[runner] cell {cell_id}: kept its finished report "
              f"({partial['status']}, {len(partial['cases'])} cases)", flush=True)
