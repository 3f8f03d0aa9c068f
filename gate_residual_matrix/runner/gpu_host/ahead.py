"""Compiling ahead for the ``modes`` step, beside its cells.

:class:`Ahead` runs in threads of its own, from the step's start:

* RL-Kernel's extension build (target cuda), in a child process;
* every file's graphs in one queue of compile workers (:mod:`runner.gpu_host.compile_queue`):
  one job per mode over every file, the files in the order given (the step gives the files
  with the longest cells first), in at most :data:`PRECOMPILE_SHARE` of the time left. The
  first mode (``plain``, the only one that really compiles: the other modes' graphs mostly
  reuse its Triton kernels) gets every worker first; the later modes' jobs get the workers
  it frees.

A file's mode is **ready** (:meth:`Ahead.ready`) once its graphs are in the caches (its calls
made and its stamp left; or failed, or the time ran out: its cell then compiles what is
missing itself) and, for a file with RL-Kernel's rows, the build has ended. The queue starts
a cell only when it is ready, so the first files' cells run their checks while the others
compile.

While any worker or RL-Kernel's build runs, the step holds the GPU lock's compile gate
(:func:`contract.gpu_lock.compiling`): the workers compile (every CPU busy) and run kernels
on the GPU (their calls, inductor's autotuning) outside the lock, so no cell takes its
timings until they are done; a cell whose checks end sooner waits for the gate with its
timings (``phases.gpu_lock_wait.exclusive``). The gate does not open after the first mode
with the later modes' workers under the shared lock: measured on the H200, every timing pass
then waited behind calls that compiled for real while holding it, and every other process
behind that pass (docs/performance.md, "One compile queue").

Example::

    ahead = Ahead(run, todo={Path("matrix.yaml"): ["plain", "tf32"]}, cases=...)
    ahead.start()
    ahead.ready(Path("matrix.yaml"), "plain")  # False until plain's graphs are compiled
    ahead.wait()
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from pathlib import Path

from gate_residual_matrix.runner.gpu_host.steps import HostRun

PRECOMPILE_SHARE = 0.5
"""At most this share of the time left goes to compiling ahead, so that a run with a deadline
always gets to its cells (what the workers compiled before they were stopped is in the
caches; a cell compiles the rest itself)."""


class Ahead:
    """The compile-ahead of one ``modes`` step (see the module docstring).

    ``todo``: per matrix file, the modes to compile (those without a finished report), the
    files in the order their graphs are compiled; ``cases``: per file, the case ids its
    cells run (None: all); ``lock``: the GPU lock file the cells share (None: no gate);
    ``needs_build``: the files whose cells wait for RL-Kernel's build (None: all);
    ``budget``: the GPU memory the cells share case by case
    (:mod:`contract.gpu_budget`), of which the workers hold
    :data:`contract.gpu_budget.WORKER_MIB` each (at most half of it) while they run. After
    :meth:`wait`, :attr:`times` holds ``precompile_s``, ``first_wave_s`` (the first mode's
    job over), ``gate_s`` (the compile gate opened) and ``rlbuild_s`` (seconds since
    :meth:`start`) and ``ready_s`` (each ``"<file> <mode>"``'s)."""

    def __init__(self, run: HostRun, *, todo: dict[Path, list[str]],
                 cases: dict[Path, list[str] | None], lock: str | None = None,
                 budget: int | None = None, needs_build: set[Path] | None = None) -> None:
        self.run, self.todo, self.cases, self.lock = run, todo, cases, lock
        self.budget = budget
        self.needs_build = None if needs_build is None else {Path(p) for p in needs_build}
        self.times: dict = {"ready_s": {}}
        self._ready: dict[tuple[Path, str], threading.Event] = {
            (p, m): threading.Event() for p, ms in todo.items() for m in ms}
        self._built, self._done = threading.Event(), threading.Event()
        self._began = time.monotonic()
        self._threads: list[threading.Thread] = []
        self._build_proc = None
        self._gate, self._gate_lock = contextlib.ExitStack(), threading.Lock()
        self._held = contextlib.ExitStack()

    def start(self) -> Ahead:
        """Take the workers' share of the GPU's memory, then the compile gate (in this
        order, as a cell takes memory before the lock), and start the build and the
        precompile (daemon threads: an interrupted run does not wait for them; their child
        processes die with it)."""
        from gate_residual_matrix.contract import gpu_budget, gpu_lock

        self._began = time.monotonic()
        share = self.workers() * gpu_budget.WORKER_MIB
        if self.budget:
            share = min(share, self.budget // 2)  # the cells keep half, whatever the host
        self._held.enter_context(gpu_budget.reserve(share, "precompile", lock=self.lock,
                                                    budget=self.budget))
        if self.lock:
            self._gate.enter_context(gpu_lock.compiling(self.lock))
        for body in (self._build, self._compile):
            thread = threading.Thread(target=body, daemon=True, name=f"ahead {body.__name__}")
            thread.start()
            self._threads.append(thread)
        return self

    def ready(self, path: Path, mode: str) -> bool:
        """Whether the cell of ``path`` and ``mode`` may start (see the module docstring)."""
        if not self._built.is_set() and (self.needs_build is None
                                         or Path(path) in self.needs_build):
            return False
        event = self._ready.get((Path(path), mode))
        return self._done.is_set() or event is None or event.is_set()

    def wait(self) -> None:
        """Until the build and the precompile have ended (each bounded by the deadline)."""
        for thread in self._threads:
            thread.join()

    def stop(self) -> None:
        """Stop the build's process group, if it still runs (an interrupted step: the
        precompile's workers die with this process)."""
        from gate_residual_matrix.runner.gpu_host.steps import _signal_group

        proc = self._build_proc
        if proc is not None and proc.poll() is None:
            _signal_group(proc, signal.SIGKILL)

    def workers(self) -> int:
        """The compile workers of all files together: the CPUs less two, at least two (0
        with nothing to compile)."""
        from gate_residual_matrix.runner.cell.environment import available_cpus

        if not any(self.todo.values()):
            return 0
        return max(2, (available_cpus() or 2) - 2)

    def _since(self) -> float:
        return round(time.monotonic() - self._began, 1)

    def _build(self) -> None:
        try:
            if self.run.target == "cuda":
                proc = self._build_proc = self.run.start(
                    [sys.executable, "-m", "gate_residual_matrix.runner.gpu_host.probes",
                     "rlbuild"])
                rc = self.run.finish(proc)
                print(f"[modes] rlbuild: exit {rc} after {self._since():.0f} s", flush=True)
                self.times["rlbuild_s"] = self._since()
        finally:
            self._built.set()
            self._open_gate()

    def _mode_done(self, path: Path, mode: str) -> None:
        self.times["ready_s"][f"{path.name} {mode}"] = self._since()
        event = self._ready.get((path, mode))
        if event is not None:
            event.set()

    def _compile(self) -> None:
        try:
            self._precompile()
        finally:
            self.times["precompile_s"] = self._since()
            self._done.set()
            self._open_gate()
            self._held.close()  # the workers' memory share

    def _first_wave_over(self) -> None:
        self.times["first_wave_s"] = self._since()

    def _open_gate(self) -> None:
        """Once every worker and RL-Kernel's build (which loads the CPUs) have ended, the
        compile gate opens."""
        with self._gate_lock:
            if self._done.is_set() and self._built.is_set() \
                    and "gate_s" not in self.times:
                self._gate.close()
                self.times["gate_s"] = self._since()

    def _plans(self) -> list[tuple[Path, list]]:
        """Each file's :class:`runner.cell.precompile.ModePlan` (in :attr:`todo`'s order);
        the modes with nothing to compile (stamped, none, not on the target, a file that
        cannot be read) are ready at once, with a line."""
        from gate_residual_matrix.runner.cell import precompile

        files = []
        for path, modes in self.todo.items():
            if not modes:
                continue
            try:
                outcome, plans = precompile.mode_plans(path, target=self.run.target,
                                                       modes=modes, cases=self.cases.get(path))
            except Exception as err:  # costs time only: the cells compile what is missing
                outcome, plans = {m: f"{type(err).__name__}: {err}" for m in modes}, []
            for mode, what in outcome.items():
                print(f"precompile {path.name} {mode}: {what}", flush=True)
                self._mode_done(path, mode)
            if plans:
                files.append((path, plans))
        return files

    def _precompile(self) -> None:
        """Fill the compile caches of every file's modes in :attr:`todo` in one queue of
        workers (:mod:`runner.gpu_host.compile_queue`), within the time left; one line per
        file's mode as it ends."""
        from gate_residual_matrix.runner.cell import precompile as cell_precompile
        from gate_residual_matrix.runner.gpu_host import compile_queue

        files = self._plans()
        if not files:
            print("precompile: nothing left to compile", flush=True)
            return
        jobs = compile_queue.make_jobs(files, target=self.run.target)
        left = self.run.left()
        timeout_s = cell_precompile.TIMEOUT_S if left is None else \
            max(min(left * PRECOMPILE_SHARE, cell_precompile.TIMEOUT_S), 1.0)
        calls = sum(len(job.calls) for job in jobs)
        print(f"precompile: {calls} calls of {len(files)} file(s) in {self.workers()} workers, "
              f"first {', '.join(p.name for p, _ in files)}; "
              f"{', '.join(f'{j.mode} ({len(j.calls)})' for j in jobs)}", flush=True)

        def part(path: Path, mode: str, outcome: str) -> None:
            print(f"precompile {path.name} {mode}: {outcome} after {self._since():.0f} s",
                  flush=True)
            self._mode_done(path, mode)

        try:
            record = compile_queue.run_jobs(
                jobs, workers=self.workers(), timeout_s=timeout_s,
                on_part=part, on_first_over=self._first_wave_over,
                say=lambda line: print(f"precompile: {line}", flush=True))
        except Exception as err:  # costs time only: the cells compile what is missing
            print(f"precompile: failed: {type(err).__name__}: {err}", flush=True)
            return
        print(f"precompile: {record['calls']} calls in {record['seconds']:.0f} s, "
              f"{record['workers']} worker processes"
              + (f"; failed: {'; '.join(record['failed'])[:300]}" if record["failed"] else ""),
              flush=True)
