"""Compiling ahead for the ``modes`` step, beside its cells.

:class:`Ahead` runs in a thread of its own, from the step's start:

* RL-Kernel's extension build (target cuda), in a child process;
* one :func:`runner.cell.precompile.precompile_modes` per matrix file, all at once, the
  workers shared out among them by how many graph calls each has to compile
  (:func:`workers_by_calls`), in at most :data:`PRECOMPILE_SHARE` of the time left. Each
  file compiles its first mode alone, then the others (their graphs mostly reuse the first
  mode's Triton kernels), the later wave with the workers that files done sooner left free
  (:class:`WorkerPool`).

A file's mode is **ready** (:meth:`Ahead.ready`) once its graphs are in the caches (its wave
ended and left its stamp; or failed, or the time ran out: its cell then compiles what is
missing itself) and, for a file with RL-Kernel's rows, the build has ended. The queue starts
a cell only when it is ready, so the first mode's cells run their checks while the other
modes compile.

While any file's first wave or RL-Kernel's build runs, the step holds the GPU lock's compile
gate (:func:`contract.gpu_lock.compiling`): those workers compile (every CPU busy) and run
kernels on the GPU (their calls, inductor's autotuning) outside the lock, so no cell takes its
timings until they are done; a cell whose checks end sooner waits for the gate with its
timings (``phases.gpu_lock_wait.exclusive``). The later waves' graphs mostly load from the
first wave's kernels: their workers take the shared lock around each call, as a cell does,
and cells time beside them.

Example::

    ahead = Ahead(run, todo={Path("matrix.yaml"): ["plain", "tf32"]}, calls=..., cases=...)
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
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from gate_residual_matrix.runner.gpu_host.steps import HostRun

PRECOMPILE_SHARE = 0.5
"""At most this share of the time left goes to compiling ahead, so that a run with a deadline
always gets to its cells (what the workers compiled before they were stopped is in the
caches; a cell compiles the rest itself)."""


def workers_by_calls(calls: dict, total: int) -> dict:
    """``total`` workers shared out in proportion to each key's ``calls``, at least one each
    (so the shares add up to more than ``total`` when there are more keys than workers).

    >>> workers_by_calls({"a": 1260, "b": 570, "c": 0}, 14)
    {'a': 10, 'b': 4, 'c': 1}
    """
    whole = sum(calls.values()) or 1
    return {k: max(1, round(total * n / whole)) for k, n in calls.items()}


class WorkerPool:
    """The compile workers of every file, shared out wave by wave: a file's first wave gets
    its share (:func:`workers_by_calls`), a later wave its share or every worker free at the
    time, whichever is more, so that the workers of files done early go to the files still
    compiling; ``on_later(key)`` hears each later wave start. Thread-safe; ``of(key)`` is the
    view :func:`runner.cell.precompile.precompile_modes` takes as its ``workers``.

    >>> pool = WorkerPool(14, {"a": 10, "b": 4})
    >>> a, b = pool.of("a"), pool.of("b")
    >>> a.take(first=True), b.take(first=True)
    (10, 4)
    >>> a.give(10); b.take(first=False)
    10
    """

    def __init__(self, total: int, shares: dict, on_later=None) -> None:
        self.total, self.shares, self.busy = total, dict(shares), 0
        self._lock = threading.Lock()
        self._on_later = on_later

    def of(self, key) -> _Share:
        return _Share(self, key)

    def take(self, key, first: bool) -> int:
        """Workers for ``key``'s next wave (``on_later(key)`` hears a later wave start)."""
        if not first and self._on_later is not None:
            self._on_later(key)
        with self._lock:
            n = self.shares[key] if first else max(self.shares[key], self.total - self.busy)
            self.busy += n
            return n

    def give(self, n: int) -> None:
        with self._lock:
            self.busy -= n


class _Share:
    """One file's view of a :class:`WorkerPool`: ``take(first=...)`` and ``give(n)``."""

    def __init__(self, pool: WorkerPool, key) -> None:
        self.pool, self.key = pool, key

    def take(self, first: bool) -> int:
        return self.pool.take(self.key, first)

    def give(self, n: int) -> None:
        self.pool.give(n)


class Ahead:
    """The compile-ahead of one ``modes`` step (see the module docstring).

    ``todo``: per matrix file, the modes to compile (those without a finished report);
    ``calls``: per file, its graph calls (for the workers' shares); ``cases``: per file, the
    case ids its cells run (None: all); ``lock``: the GPU lock file the cells share (None: no
    gate); ``needs_build``: the files whose cells wait for RL-Kernel's build (None: all);
    ``budget``: the GPU memory the cells share case by case
    (:mod:`contract.gpu_budget`), of which the workers hold
    :data:`contract.gpu_budget.WORKER_MIB` each (at most half of it) while they run. After
    :meth:`wait`, :attr:`times` holds ``precompile_s``, ``gate_s`` (the compile gate opened)
    and ``rlbuild_s`` (seconds since :meth:`start`) and ``ready_s`` (each
    ``"<file> <mode>"``'s)."""

    def __init__(self, run: HostRun, *, todo: dict[Path, list[str]], calls: dict[Path, int],
                 cases: dict[Path, list[str] | None], lock: str | None = None,
                 budget: int | None = None, needs_build: set[Path] | None = None) -> None:
        self.run, self.todo, self.calls, self.cases, self.lock = run, todo, calls, cases, lock
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
        self._first_left: set[Path] = set()

    def start(self) -> Ahead:
        """Take the workers' share of the GPU's memory, then the compile gate (in this
        order, as a cell takes memory before the lock), and start the build and the
        precompile (daemon threads: an interrupted run does not wait for them; their child
        processes die with it)."""
        from gate_residual_matrix.contract import gpu_budget, gpu_lock

        self._began = time.monotonic()
        self._first_left = {p for p, ms in self.todo.items() if ms}
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

    _NO_FILE = Path("\0")  # what the build's end reports to _first_wave_over

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
            self._first_wave_over(self._NO_FILE)

    def _mode_done(self, path: Path, mode: str) -> None:
        self.times["ready_s"][f"{path.name} {mode}"] = self._since()
        event = self._ready.get((path, mode))
        if event is not None:
            event.set()

    def _compile(self) -> None:
        try:
            self._precompile()
        finally:
            self._first_wave_over(None)
            self._held.close()  # the workers' memory share
            self.times["precompile_s"] = self._since()
            self._done.set()

    def _first_wave_over(self, path: Path | None) -> None:
        """``path``'s first wave has ended (None: every file's): once no file is left in
        its first wave and RL-Kernel's build (which loads the CPUs) has ended, the compile
        gate opens (the later waves' calls take the shared lock)."""
        with self._gate_lock:
            self._first_left.discard(path) if path is not None else self._first_left.clear()
            if not self._first_left and self._built.is_set() and "gate_s" not in self.times:
                self._gate.close()
                self.times["gate_s"] = self._since()

    def _precompile(self) -> None:
        """Fill the compile caches of every file's modes in :attr:`todo`, all files at once,
        within the time left; prints one line per file."""
        from gate_residual_matrix.runner.cell import precompile as cell_precompile

        todo = {p: ms for p, ms in self.todo.items() if ms}
        if not todo:
            print("precompile: nothing left to compile", flush=True)
            return
        pool = WorkerPool(self.workers(), workers_by_calls(
            {p: self.calls.get(p, 0) for p in todo}, self.workers()),
            on_later=self._first_wave_over)
        left = self.run.left()
        timeout_s = cell_precompile.TIMEOUT_S if left is None else \
            max(min(left * PRECOMPILE_SHARE, cell_precompile.TIMEOUT_S), 1.0)

        def one(path: Path, modes: list[str]) -> str:
            try:
                done = cell_precompile.precompile_modes(
                    path, target=self.run.target, modes=modes, workers=pool.of(path),
                    timeout_s=timeout_s, cases=self.cases.get(path),
                    say=lambda s: print(f"precompile {path.name}: {s}", flush=True),
                    on_mode=lambda mode: self._mode_done(path, mode), later_lock=self.lock)
            except Exception as err:  # costs time only: the cells compile what is missing
                done = f"{type(err).__name__}: {err}"
            finally:
                self._first_wave_over(path)
            return f"precompile {path.name}: {done} after {self._since():.0f} s"

        import torch  # noqa: F401  (imported once here, not by every thread at once)
        for line in in_threads([(one, (p, ms)) for p, ms in todo.items()]):
            print(line, flush=True)


def in_threads(calls: list[tuple[Callable, tuple]], jobs: int | None = None) -> list:
    """Each ``(function, args)`` of ``calls`` in daemon threads, ``jobs`` at a time (default:
    all); their results in order (the first error raised again). Daemon threads: an
    interrupted run exits without waiting for them (their child processes die with it)."""
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
