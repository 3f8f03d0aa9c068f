"""The ``modes`` step: the cells of several matrix files in several modes on one GPU.

In this order, within the run's deadline:

1. **Resume.** Reports carried in ``.carry/resume/`` (a stopped run's ``OUT/reports``) are
   copied into ``OUT/reports`` where it has none of that cell: a finished cell of the same
   fingerprint is not run again, a partial one runs only its missing cases.
2. **Compile ahead.** One :func:`runner.cell.precompile.precompile_modes` per matrix file,
   all at once (the CPUs shared out among them), each filling the compile caches for every
   selected mode in one pool of workers and leaving its stamps, in at most
   :data:`PRECOMPILE_SHARE` of the time left; a mode whose cells already have an ``ok``
   report is left out. RL-Kernel's extension builds beside them (target cuda).
3. **The cells**, mode by mode (every file's cell of the first mode, then the next mode),
   each through :func:`runner.pipeline.run_matrix` on the host backend (its shards share the
   GPU under :mod:`contract.gpu_lock`) with the time left as its timeout: a cell stopped at
   the deadline keeps its finished cases as a ``partial`` report, and a cell whose turn comes
   with less than :data:`MIN_CELL_S` left is not started. With ``--jobs N`` N modes run at
   once, each cell process's thread pools sized to its share of the CPUs, every process
   under one GPU lock file (each case's timing loops alone on the GPU).
4. **Summary**: one line per report in ``OUT/reports``.

The step fails when a cell did not end ``ok``, one was not started, or a file could not run.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path

from gate_residual_matrix.runner.gpu_host.steps import HostRun

MIN_CELL_S = 30.0
"""A cell started with less time left than this would end before its first case."""
PRECOMPILE_SHARE = 0.5
"""At most this share of the time left goes to compiling ahead, so that a run with a deadline
always gets to its cells (what the workers compiled before they were stopped is in the
caches; a cell compiles the rest itself)."""
RESUME = Path(".carry") / "resume"


def load(paths: Sequence[Path]) -> dict[Path, object]:
    """``{path: Matrix}`` of each matrix file (raises :class:`runner.errors.ConfigError`)."""
    from gate_residual_matrix.runner.cell import catalog
    from gate_residual_matrix.runner.config.matrix import load_matrix

    return {Path(p): load_matrix(p, known_implementations=catalog.known) for p in paths}


def ops_of(paths: Sequence[Path]) -> list[str]:
    """The ops of these matrix files, once each, in their order."""
    return list(dict.fromkeys(m.op for m in load(paths).values()))


def resume(run: HostRun, reports: Path) -> list[str]:
    """Copy ``.carry/resume/*.json`` into ``reports`` where it has no such file; the names
    copied."""
    reports.mkdir(parents=True, exist_ok=True)
    copied = []
    for src in sorted((run.root / RESUME).glob("*.json")):
        if not (reports / src.name).exists():
            shutil.copy2(src, reports / src.name)
            copied.append(src.name)
    return copied


def _cell_id(matrix, mode: str, target: str) -> str | None:
    from gate_residual_matrix.runner.plan.cells import expand

    ids = [c.id for c in expand(matrix) if (c.stack, c.mode, c.target) == ("host", mode, target)]
    return ids[0] if ids else None


def finished(reports: Path, matrix, mode: str, target: str) -> bool:
    """Whether ``reports`` holds an ``ok`` report of the host cell (``mode``, ``target``)."""
    from gate_residual_matrix.runner.reports import store

    cell = _cell_id(matrix, mode, target)
    path = reports / f"{cell}.json"
    if cell is None or not path.is_file():
        return False
    data = store.read_report(path).data
    return bool(data and data.get("status") == "ok")


def runnable(matrix, modes: Sequence[str], target: str) -> list[str]:
    """The ``modes`` that ``matrix`` has on ``target``."""
    return [m for m in modes if m in matrix.modes and matrix.modes[m].runs_on(target)]


def cases_of(matrix, cases: Sequence[str] | None) -> list[str] | None:
    """Those of ``cases`` that ``matrix`` has (None: all of its cases)."""
    return None if cases is None else [c for c in cases if c in {k.id for k in matrix.cases}]


def precompile(run: HostRun, loaded: dict, reports: Path) -> None:
    """Fill the compile caches of every file's unfinished modes, all files at once, within
    the time left; prints one line per file."""
    from gate_residual_matrix.runner.cell import precompile as ahead
    from gate_residual_matrix.runner.cell.environment import available_cpus

    todo = {p: [m for m in runnable(mx, run.modes, run.target)
                if not finished(reports, mx, m, run.target)] for p, mx in loaded.items()
            if cases_of(mx, run.cases) != []}
    todo = {p: ms for p, ms in todo.items() if ms}
    if not todo:
        print("precompile: nothing left to compile")
        return
    per = max(1, ((available_cpus() or 2) - 2) // len(todo))
    started = time.monotonic()
    left = run.left()
    timeout_s = ahead.TIMEOUT_S if left is None else \
        max(min(left * PRECOMPILE_SHARE, ahead.TIMEOUT_S), 1.0)

    def one(path: Path, modes: list[str]) -> str:
        try:
            done = ahead.precompile_modes(
                path, target=run.target, modes=modes, workers=per, timeout_s=timeout_s,
                cases=cases_of(loaded[path], run.cases),
                say=lambda s: print(f"precompile {path.name}: {s}", flush=True))
        except Exception as err:  # costs time only: the cells compile what is missing
            done = f"{type(err).__name__}: {err}"
        return f"precompile {path.name}: {done} after {time.monotonic() - started:.0f} s"

    import torch  # noqa: F401  (imported once here, not by every thread at once)
    for line in _in_threads([(one, (p, ms)) for p, ms in todo.items()]):
        print(line, flush=True)


def _in_threads(calls: list[tuple], jobs: int | None = None) -> list:
    """Each ``(function, args)`` of ``calls`` in daemon threads, ``jobs`` at a time (default:
    all); their results in order. Daemon threads: an interrupted run exits without waiting
    for them (their child processes die with it)."""
    jobs = jobs or len(calls)
    futures: list[Future] = [Future() for _ in calls]
    queue = list(enumerate(calls))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                i, (fn, args) = queue.pop(0)
            try:
                futures[i].set_result(fn(*args))
            except BaseException as err:
                futures[i].set_exception(err)

    for _ in range(min(jobs, len(calls))):
        threading.Thread(target=worker, daemon=True).start()
    return [f.result() for f in futures]


def run_cells(run: HostRun, loaded: dict, reports: Path, mode: str) -> tuple[list, list[str]]:
    """Every file's host cell of ``mode`` on the target, one after another; their outcomes
    and the problems (a file that could not run, a cell not started)."""
    from gate_residual_matrix.runner.errors import MatrixError
    from gate_residual_matrix.runner.pipeline import run_matrix

    outcomes, problems = [], []
    for path, matrix in loaded.items():
        if mode not in runnable(matrix, [mode], run.target):
            continue
        cases = cases_of(matrix, run.cases)
        if cases == []:
            continue
        left = run.left()
        if left is not None and left < MIN_CELL_S:
            problems.append(f"{path.name} {mode}: not started ({max(left, 0):.0f} s left)")
            print(f"[modes] {problems[-1]}", flush=True)
            continue
        print(f"[modes] {path.name} {mode}: {'no limit' if left is None else f'{left:.0f} s left'}",
              flush=True)
        try:
            outcomes += run_matrix(path, reports_dir=reports, stacks=["host"], modes=[mode],
                                   targets=[run.target], cases=cases, backend="host",
                                   timeout_s=3600.0 if left is None else left, render=False)
        except MatrixError as err:
            problems.append(f"{path.name} {mode}: {err}")
            print(f"[modes] {problems[-1]}", flush=True)
    return outcomes, problems


def _share_cpus(jobs: int) -> None:
    """Several modes at once: one GPU lock for every cell process, and each cell's thread
    pools sized to its share of the CPUs."""
    from gate_residual_matrix.contract import gpu_lock
    from gate_residual_matrix.runner.cell.environment import available_cpus

    lock = Path(os.environ.get(gpu_lock.ENV) or Path("build") / "gpu.lock").resolve()
    lock.parent.mkdir(parents=True, exist_ok=True)
    threads = str(max(2, (available_cpus() or 2) // jobs))
    os.environ.update({gpu_lock.ENV: str(lock), "OMP_NUM_THREADS": threads,
                       "NUMBA_NUM_THREADS": threads})
    print(f"[modes] {jobs} modes at once under the GPU lock {lock}, {threads} threads each")


def summary(reports: Path) -> list[str]:
    """One line per cell report in ``reports``: id, status, seconds, cases."""
    from gate_residual_matrix.runner.reports import store

    lines = []
    for path in sorted(reports.glob("*.json")):
        data = store.read_report(path).data
        if data and "cell" in data:
            lines.append(f"{data['cell']['id']}: {data['status']}, {data.get('duration_s')} s, "
                         f"{len(data.get('cases') or [])} cases")
    return lines


def run_modes(run: HostRun) -> int:
    """The step (see the module docstring); 0 when every cell ended ``ok``."""
    from gate_residual_matrix.runner.outcome import failed
    from gate_residual_matrix.runner.outcome import summary as outcome_summary

    reports = run.out / "reports"
    copied = resume(run, reports)
    if copied:
        print(f"[modes] resuming from {RESUME}: {', '.join(copied)}")
    loaded = load(run.matrices)
    started = time.monotonic()
    build = None
    if run.target == "cuda":
        build = run.start([sys.executable, "-m", "gate_residual_matrix.runner.gpu_host.probes",
                           "rlbuild"])
    try:
        precompile(run, loaded, reports)
    finally:
        if build is not None:
            rc = run.finish(build)
            print(f"[modes] rlbuild: exit {rc} after {time.monotonic() - started:.0f} s",
                  flush=True)
    if run.jobs > 1:
        _share_cpus(run.jobs)
    results = _in_threads([(run_cells, (run, loaded, reports, m)) for m in run.modes],
                          run.jobs) if run.jobs > 1 else \
        [run_cells(run, loaded, reports, m) for m in run.modes]
    outcomes = [o for done, _ in results for o in done]
    problems = [p for _, ps in results for p in ps]
    print(f"[modes] all modes: {time.monotonic() - started:.0f} s wall")
    if outcomes:
        print(outcome_summary(outcomes))
    for line in summary(reports):
        print(f"  {line}")
    for problem in problems:
        print(f"[modes] {problem}")
    return 1 if failed(outcomes) or problems or not outcomes else 0
