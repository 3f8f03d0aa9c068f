"""The ``modes`` step: the cells of several matrix files in several modes on one GPU.

In this order, within the run's deadline:

1. **Resume.** Reports carried in ``.carry/resume/`` (a stopped run's ``OUT/reports``) are
   copied into ``OUT/reports`` where it has none of that cell: a finished cell of the same
   fingerprint is not run again, a partial one runs only its missing cases.
2. **Compile ahead, beside the cells** (:mod:`runner.gpu_host.ahead`): one queue of compile
   workers fills the compile caches for every file's selected modes (a mode whose cells
   already have an ``ok`` report is left out), the files with the longest cells first, and
   leaves each file's mode's stamp as soon as its calls are made; RL-Kernel's extension
   builds beside them (target cuda). A cell starts once its mode is compiled; no cell takes
   its timings while any worker or the build runs (the GPU lock's compile gate).
3. **The cells.** With ``--jobs 1``, after the compile-ahead, one after another in this
   process, mode by mode (every file's cell of the first mode, then the next mode).
   Otherwise from one queue (:func:`runner.gpu_host.schedule.run_queue`), each cell its own
   runner process (:mod:`runner.gpu_host.cell_queue`) that starts once its mode is compiled
   (step 2): at most ``jobs`` at once, each taking :data:`CPUS_PER_SHARD` CPUs per shard
   (:data:`OVERSUBSCRIBE` shard processes per CPU on target cuda), the longest cells first
   (:func:`expected_work`), their cases sharing the GPU's memory (:mod:`contract.gpu_budget`); every
   cell process under one GPU lock file (each cell process's timing loops alone on the GPU).
   Each cell runs on the host backend with the time left as its timeout: a cell stopped at
   the deadline keeps its finished cases as a ``partial`` report, and a cell whose turn
   comes with less than :data:`MIN_CELL_S` left is not started.
4. **Summary**: one line per report in ``OUT/reports``, and ``OUT/modes-timeline.json``:
   each part's seconds since the step began (the precompile, RL-Kernel's build, when each
   file's mode was compiled, every cell's start and end with its CPUs and status), the most
   cells that ran at once, and the most GPU memory in use while the cells ran
   (``nvidia-smi``, sampled; null without it).

The step fails when a cell did not end ``ok``, one was not started, or a file could not run.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from gate_residual_matrix.runner.gpu_host.steps import HostRun

MIN_CELL_S = 30.0
"""A cell started with less time left than this would end before its first case."""
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


def _selected(matrix, run: HostRun) -> list:
    """The cases of ``matrix`` that its cells run on the target (``run.cases`` of them)."""
    from gate_residual_matrix.runner.plan.cells import cases_on

    ids = cases_of(matrix, run.cases)
    return cases_on([c for c in matrix.cases if ids is None or c.id in ids], run.target)


def expected_work(matrix, cases: Sequence, target: str, cpus: int | None) -> float:
    """How long a cell of ``cases`` is expected to run, in arbitrary units, for ordering:
    its heaviest shard's case weights (:func:`runner.cell.run.case_weight`, as
    :func:`runner.backends.shards.split` parts them) times its implementation rows. A cell
    lasts about as long as its heaviest shard, and a shard's time goes mostly into calling
    each implementation on each case and checking it (docs/performance.md, "Cell time")."""
    from gate_residual_matrix.runner.backends import shards
    from gate_residual_matrix.runner.cell import catalog
    from gate_residual_matrix.runner.cell.run import case_weight

    if not cases:
        return 0.0
    n = shards.count(matrix, cases, target, cpus)
    parts = shards.split(matrix, list(cases), n) if n > 1 else [list(cases)]
    heaviest = max(sum(case_weight(matrix, c) for c in p) for p in parts)
    return heaviest * len(catalog.rows(matrix))


def compile_ahead(run: HostRun, loaded: dict, reports: Path, lock: str | None,
                  budget: int | None = None):
    """The started :class:`runner.gpu_host.ahead.Ahead` of every file's modes that have no
    finished report, the files with the longest cells (:func:`expected_work`) first.
    ``lock``: the cells' GPU lock file, for its compile gate, whose memory ledger is cleared
    first; ``budget``: the GPU memory the cells share, of which the workers hold their
    part."""
    from gate_residual_matrix.contract import gpu_budget, rl_kernel_tree
    from gate_residual_matrix.runner.gpu_host.ahead import Ahead

    if lock is not None:  # this step owns the ledger: an earlier run's entries go
        gpu_budget.clear(lock)

    from gate_residual_matrix.runner.cell.environment import available_cpus

    cpus = available_cpus()
    longest_first = sorted(loaded, key=lambda p: -expected_work(
        loaded[p], _selected(loaded[p], run), run.target, cpus))
    todo = {p: [m for m in runnable(loaded[p], run.modes, run.target)
                if not finished(reports, loaded[p], m, run.target)] for p in longest_first
            if cases_of(loaded[p], run.cases) != []}
    return Ahead(run, todo=todo, cases={p: cases_of(mx, run.cases) for p, mx in loaded.items()},
                 lock=lock, budget=budget,
                 needs_build={p for p, mx in loaded.items()
                              if set(rl_kernel_tree.ROWS) & set(mx.implementations)}).start()


def _time_for(run: HostRun, path: Path, mode: str) -> tuple[float | None, str | None]:
    """The seconds left for the cell of ``path`` and ``mode`` (None: no limit), and the
    problem when too few are left to start it (:data:`MIN_CELL_S`); prints which."""
    left = run.left()
    if left is not None and left < MIN_CELL_S:
        problem = f"{path.name} {mode}: not started ({max(left, 0):.0f} s left)"
        print(f"[modes] {problem}", flush=True)
        return left, problem
    print(f"[modes] {path.name} {mode}: {'no limit' if left is None else f'{left:.0f} s left'}",
          flush=True)
    return left, None


def run_cell(run: HostRun, path: Path, matrix, reports: Path, mode: str,
             ) -> tuple[list, list[str]]:
    """The host cell of ``mode`` of one matrix file on the target, if the file has it and
    there is time; its outcomes and the problems (the file could not run, the cell was not
    started)."""
    from gate_residual_matrix.runner.errors import MatrixError
    from gate_residual_matrix.runner.pipeline import run_matrix

    if mode not in runnable(matrix, [mode], run.target):
        return [], []
    cases = cases_of(matrix, run.cases)
    if cases == []:
        return [], []
    left, problem = _time_for(run, path, mode)
    if problem:
        return [], [problem]
    try:
        return run_matrix(path, reports_dir=reports, stacks=["host"], modes=[mode],
                          targets=[run.target], cases=cases, backend="host",
                          timeout_s=3600.0 if left is None else left, render=False), []
    except MatrixError as err:
        problem = f"{path.name} {mode}: {err}"
        print(f"[modes] {problem}", flush=True)
        return [], [problem]


def jobs_for(run: HostRun) -> int:
    """Cells at once: ``run.jobs``, or for 0 (auto) as many as the CPUs hold on target cuda
    (the queue's CPU count decides) and one on cpu (its cells compute on those CPUs)."""
    from gate_residual_matrix.runner.cell.environment import available_cpus

    if run.jobs:
        return run.jobs
    return max(1, available_cpus() or 1) if run.target == "cuda" else 1


def units(run: HostRun, loaded: dict, reports: Path, running=None, ready=None,
          budget: int | None = None) -> list:
    """The queue's units (:class:`runner.gpu_host.schedule.Unit`): one per file and mode
    that has a host cell on the target, each a runner process
    (:mod:`runner.gpu_host.cell_queue`) taking :data:`CPUS_PER_SHARD` CPUs per shard of its
    cell and its estimated GPU memory (:func:`runner.gpu_host.footprint.cell_mib`, target
    cuda), the longest first (:func:`expected_work`; in mode order, then file order, among
    equals): longest processing time first, so that the last cells are short ones.
    ``running``: the :class:`~runner.gpu_host.cell_queue.Running` they register with;
    ``ready(path, mode)``: whether a unit may start yet (:meth:`.ahead.Ahead.ready`);
    ``budget``: the GPU memory (MiB) the cells share case by case (:mod:`contract.gpu_budget`;
    each unit's ``memory`` is then its cell's estimated peak, for the timeline)."""
    from gate_residual_matrix.runner.backends import shards
    from gate_residual_matrix.runner.cell.environment import available_cpus
    from gate_residual_matrix.runner.gpu_host import footprint
    from gate_residual_matrix.runner.gpu_host.cell_queue import Running, environment
    from gate_residual_matrix.runner.gpu_host.schedule import Unit
    cpus = available_cpus()
    running = running if running is not None else Running()
    env = environment(run, budget)
    out = []
    for mode in run.modes:
        for path, matrix in loaded.items():
            if mode not in runnable(matrix, [mode], run.target) \
                    or cases_of(matrix, run.cases) == []:
                continue
            selected = _selected(matrix, run)
            need = shards.count(matrix, selected, run.target, cpus)
            work = expected_work(matrix, selected, run.target, cpus)
            out.append((work, Unit(
                f"{path.name} {mode}", need * CPUS_PER_SHARD,
                lambda p=path, m=matrix, md=mode: _queued(run, p, m, reports, md, env, running),
                memory=footprint.cell_mib(matrix, selected, need)
                if run.target == "cuda" else 0,
                ready=None if ready is None else (lambda p=path, md=mode: ready(p, md)))))
    return [unit for _, unit in sorted(out, key=lambda wu: -wu[0])]


def _queued(run: HostRun, path: Path, matrix, reports: Path, mode: str, env: dict,
            running) -> tuple[list, list[str]]:
    """One unit of the queue: the cell's runner process, if there is time for it; its
    outcome (from its report) and the problems, as :func:`run_cell`'s."""
    from gate_residual_matrix.runner.gpu_host import cell_queue

    left, problem = _time_for(run, path, mode)
    if problem:
        return [], [problem]
    command = cell_queue.argv(run, path, mode, reports, 3600.0 if left is None else left,
                              cases_of(matrix, run.cases))
    began = time.time()
    rc = cell_queue.spawn(run, command, env, running)
    return [cell_queue.outcome(reports, _cell_id(matrix, mode, run.target), rc, since=began)], []


CPUS_PER_SHARD = 1
"""CPUs a cell process is counted for: its Python thread."""
OVERSUBSCRIBE = 1.5
"""Shard processes per CPU of the host that the queue lets run at once (on target cuda). A
cell process spends much of its life waiting, not computing: for the GPU lock, for its share
of the GPU's memory (:mod:`contract.gpu_budget`), for the compile-ahead to end before its
timings; and the host's CPUs were mostly idle with one cell at a time (docs/performance.md,
"Cells side by side")."""
TIMELINE = "modes-timeline.json"


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


def _one_by_one(run: HostRun, loaded: dict, reports: Path) -> list:
    """``--jobs 1``: every file's cell of each mode in turn, in this process (as
    :func:`run_cells`), each as a finished :class:`~runner.gpu_host.schedule.Unit` with its
    times."""
    from gate_residual_matrix.runner.gpu_host.schedule import Unit

    began, done = time.monotonic(), []
    for mode in run.modes:
        for path, matrix in loaded.items():
            unit = Unit(f"{path.name} {mode}", 1, lambda: None)
            unit.started_s = round(time.monotonic() - began, 3)
            unit.result = run_cell(run, path, matrix, reports, mode)
            unit.ended_s = round(time.monotonic() - began, 3)
            if unit.result != ([], []):  # a file without this mode or these cases: no cell
                done.append(unit)
    return done


def run_modes(run: HostRun) -> int:
    """The step (see the module docstring); 0 when every cell ended ``ok``."""
    from gate_residual_matrix.runner.cell.case import one_line
    from gate_residual_matrix.runner.cell.environment import available_cpus
    from gate_residual_matrix.runner.gpu_host.schedule import most_at_once, run_queue
    from gate_residual_matrix.runner.outcome import failed
    from gate_residual_matrix.runner.outcome import summary as outcome_summary
    from gate_residual_matrix.runner.untrusted.files import write_text_atomic

    reports = run.out / "reports"
    copied = resume(run, reports)
    if copied:
        print(f"[modes] resuming from {RESUME}: {', '.join(copied)}")
    loaded = load(run.matrices)
    started = time.monotonic()
    from gate_residual_matrix.runner.gpu_host.footprint import capacity_mib

    timeline: dict = {"jobs": jobs_for(run), "cpus": available_cpus(),
                      "gpu_memory_mib": capacity_mib() if run.target == "cuda" else None}
    jobs = timeline["jobs"]
    from gate_residual_matrix.contract import gpu_lock
    from gate_residual_matrix.runner.gpu_host import cell_queue
    from gate_residual_matrix.runner.gpu_host.cell_queue import THREADS, Running
    from gate_residual_matrix.runner.gpu_host.gpu_memory import PeakMemory

    lock = cell_queue.environment(run)[gpu_lock.ENV] if jobs > 1 else None
    budget = timeline["gpu_memory_mib"] if jobs > 1 else None
    timeline["gpu_budget_mib"] = budget
    with PeakMemory() as memory:
        ahead = compile_ahead(run, loaded, reports, lock, budget)
        try:
            if jobs > 1:
                room = ("GPU memory not counted" if budget is None else
                        f"{budget} MiB of GPU memory shared case by case")
                print(f"[modes] cells from one queue, each once its mode is compiled: at most "
                      f"{jobs} at once, {CPUS_PER_SHARD} CPU(s) per shard ({timeline['cpus']} in "
                      f"all, x{OVERSUBSCRIBE if run.target == 'cuda' else 1}), {room}, "
                      f"{THREADS} threads per process, one GPU lock", flush=True)
                running = Running()
                cells_began = time.monotonic()
                slots = max(1, int((timeline["cpus"] or 1)
                                   * (OVERSUBSCRIBE if run.target == "cuda" else 1)))
                try:
                    done = run_queue(units(run, loaded, reports, running, ready=ahead.ready,
                                           budget=budget),
                                     jobs=jobs, cpus=slots)
                except BaseException:  # Ctrl-C, SIGTERM: the running cells write what they did
                    running.interrupt()
                    raise
            else:
                ahead.wait()
                cells_began = time.monotonic()
                done = _one_by_one(run, loaded, reports)
            ahead.wait()
        except BaseException:
            ahead.stop()
            raise
        timeline.update(ahead.times)
        results = [u.result if u.error is None else ([], [f"{u.name}: {one_line(u.error)}"])
                   for u in done]
        timeline["cells"] = cell_queue.timeline_entries(done, cells_began - started)
        timeline["most_at_once"] = most_at_once([u for u in done if u.result and u.result[0]])
    timeline.update(cells_s=round(time.monotonic() - cells_began, 1),
                    wall_s=round(time.monotonic() - started, 1),
                    gpu_memory_peak_mib=memory.peak)
    write_text_atomic(run.out / TIMELINE, json.dumps(timeline, indent=1, default=str) + "\n")
    outcomes = [o for done, _ in results for o in done]
    problems = [p for _, ps in results for p in ps]
    print(f"[modes] all modes: {time.monotonic() - started:.0f} s wall "
          f"(precompile {timeline.get('precompile_s', 0):.0f} s, cells {timeline['cells_s']:.0f} s"
          f", at most {timeline['most_at_once']} at once; GPU memory peak "
          f"{'unknown' if memory.peak is None else f'{memory.peak} MiB'}); {TIMELINE}")
    if outcomes:
        print(outcome_summary(outcomes))
    for line in summary(reports):
        print(f"  {line}")
    for problem in problems:
        print(f"[modes] {problem}")
    return 1 if failed(outcomes) or problems or not outcomes else 0
