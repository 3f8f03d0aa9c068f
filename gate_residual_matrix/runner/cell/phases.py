"""Where a cell's time goes: wall seconds per phase, as the report's ``phases`` records them.

The phases do not overlap; each is the wall time spent in that part of the cell, with the
GPU synchronised at every phase boundary (``torch.cuda.synchronize``), so asynchronous GPU
work is charged to the phase that queued it, not to the next one that waits:

``setup``
    environment capture, imports, availability checks (everything before the first case).
``precompile``
    waiting for :mod:`runner.cell.precompile`'s workers (compiling ahead, in parallel).
``inputs``
    building each case's inputs from the seed, their sha256 and moving them to the device.
``runs``
    per implementation: its repeated calls (forward, then backward) on fresh clones,
    repeatability check included; the accuracy reference's run is under its own name.
``hashing``
    sha256 of every implementation's outputs.
``comparisons``
    bitwise comparisons with the baseline.
``accuracy``
    error figures against the accuracy reference.
``batch_invariance``, ``timings``
    :mod:`runner.cell.batch_invariance` and the timing loops.

``compilation`` is not a phase of its own but the part of the others spent compiling:
``torch.compile`` (dynamo's ``entire_frame_compile`` + ``entire_backward_compile``,
:func:`torch._dynamo.utils.calculate_time_spent`) plus our numba kernels' compile and load
(:data:`kernels.launch.COMPILE_SECONDS`). ``gpu_lock_wait``, likewise a part of the others,
is the time its threads spent waiting for the GPU lock that the cells of one host share
(:func:`contract.gpu_lock.waited_s`): ``shared``, before GPU work (the main thread's, or a
hashing thread's copies) while another process timed or was about to; ``exclusive``, before
its own timing loops, while other processes timed or finished their stretch (a part of
``timings``), of which ``drain`` is the wait for the other processes' current stretches
once no new one could start (every other process that asked for the GPU meanwhile stood
still) and ``long`` the wait before it for their long stretches in flight, with nobody
standing still (:mod:`contract.stretch_board`). A hashing thread's wait may overlap the main
thread's work, so the figures are an upper bound on the time the cell stood still.
``gpu_exclusive`` is the time it held
the GPU alone for its timing loops (:func:`contract.gpu_lock.held_s`, a part of
``timings``): what every other process on the host waited for. ``gpu_memory_wait`` is the
time it waited for its share of the GPU's memory before a case or its timing pass
(:mod:`contract.gpu_budget`, a part of ``other``). Where the cell shared the GPU under the
lock, ``gpu_shared_stretches`` and ``gpu_shared_stretch_count`` are its stretches of shared
GPU work by length (:func:`contract.gpu_lock.stretches`): seconds and counts per bucket,
what other processes' timing passes waited for; ``gpu_shared_long`` the seconds of those at
least :data:`contract.gpu_lock.LONG_S` long by where each began (a function, and the
implementation the cell was running), and ``gpu_shared_long_joins`` how many times another
thread joined those stretches in progress (many: a chain of overlapping holds);
``gpu_lock_set_aside`` the seconds its stretches spent without the lock while compiling
(:mod:`contract.compile_aside`). ``setup_parts`` splits
``setup`` by what took :data:`PART_MIN_S` or more in a process: ``environment`` (its
capture), ``compile_aside`` (the compile hooks and what ``torch.compile`` imports,
:mod:`contract.compile_aside`) and each implementation row's availability check and code
path (a library row imports its library there), longest first (a sharded cell's sums over
its processes).
``other`` is the cell's wall time not in any phase.

Example::

    >>> clock = PhaseClock(sync=False)
    >>> with clock("inputs"):
    ...     pass
    >>> sorted(clock.as_report(total_s=0.0))[:3]
    ['accuracy', 'batch_invariance', 'comparisons']
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections import defaultdict
from collections.abc import Iterator

PHASES = ("setup", "precompile", "inputs", "runs", "hashing", "comparisons", "accuracy",
          "batch_invariance", "timings")
PART_MIN_S = 0.05
"""The shortest part of ``setup`` that ``setup_parts`` names."""


def torch_compile_seconds() -> float:
    """Seconds this process has spent in ``torch.compile`` so far (0.0 when torch's dynamo
    was never imported or does not keep the figure)."""
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    if dynamo_utils is None:
        return 0.0
    try:
        return float(dynamo_utils.calculate_time_spent().get("total_wall_time", 0.0))
    except Exception:  # a private API: a torch without it reports no figure, not a crash
        return 0.0


def kernel_compile_seconds() -> float:
    """Seconds this process has spent compiling and loading our numba.cuda kernels."""
    launch = sys.modules.get("gate_residual_matrix.kernels.launch")
    return float(launch.COMPILE_SECONDS[0]) if launch is not None else 0.0


class PhaseClock:
    """Accumulates wall seconds per phase; ``with clock("inputs"): ...``.

    ``sync``: synchronise the CUDA device at each boundary (a cuda cell). Nested use of the
    same clock charges the inner phase only (the outer one is paused), so the phases never
    overlap. ``clock.run(impl_name)`` is the ``runs`` phase of one implementation.
    """

    def __init__(self, *, sync: bool) -> None:
        self.sync = sync
        self.seconds: dict[str, float] = defaultdict(float)
        self.runs: dict[str, float] = defaultdict(float)
        self.parts: dict[str, float] = defaultdict(float)
        self._stack: list[tuple[str, str | None, float]] = []
        self._compile0 = torch_compile_seconds() + kernel_compile_seconds()
        self._waited0 = _lock("waited_s", _NO_WAITS)
        self._held0 = _lock("held_s", 0.0)
        self._memory0 = _memory_waited()
        self._stretch0 = _lock("stretches", ({}, {}))
        self._aside0 = _lock("aside_s", 0.0)
        self._long0 = _lock("long_stretches", {})
        self._joins0 = _lock("long_stretch_joins", {})

    def _now(self) -> float:
        if self.sync:
            import torch

            torch.cuda.synchronize()
        return time.perf_counter()

    def _charge(self, phase: str, impl: str | None, seconds: float) -> None:
        if impl is None:
            self.seconds[phase] += seconds
        else:
            self.runs[impl] += seconds

    @contextlib.contextmanager
    def __call__(self, phase: str, impl: str | None = None) -> Iterator[None]:
        now = self._now()
        if self._stack:  # pause the enclosing phase
            outer, outer_impl, since = self._stack[-1]
            self._charge(outer, outer_impl, now - since)
        self._stack.append((phase, impl, now))
        try:
            yield
        finally:
            end = self._now()
            _, _, since = self._stack.pop()
            self._charge(phase, impl, end - since)
            if self._stack:  # resume it
                outer, outer_impl, _ = self._stack[-1]
                self._stack[-1] = (outer, outer_impl, end)

    def run(self, impl: str):
        """The ``runs`` phase of implementation ``impl``."""
        return self(phase="runs", impl=impl)

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        """A named part of the current phase (``setup_parts``): wall seconds, no
        synchronisation, charged to the phase as before."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.parts[name] += time.perf_counter() - began

    def compilation_s(self) -> float:
        """Seconds spent compiling since the clock started (see the module docstring)."""
        return torch_compile_seconds() + kernel_compile_seconds() - self._compile0

    def as_report(self, *, total_s: float) -> dict:
        """The report's ``phases``: every phase of :data:`PHASES` in seconds (rounded to ms),
        ``runs`` per implementation, ``compilation``, ``gpu_lock_wait``, ``gpu_exclusive``,
        ``gpu_memory_wait`` and ``other`` (``total_s`` minus the phases)."""
        out: dict = {p: round(self.seconds.get(p, 0.0), 3) for p in PHASES if p != "runs"}
        out["runs"] = {k: round(v, 3) for k, v in self.runs.items()}
        spent = sum(self.seconds.values()) + sum(self.runs.values())
        out["compilation"] = round(max(self.compilation_s(), 0.0), 3)
        now = _lock("waited_s", _NO_WAITS)
        out["gpu_lock_wait"] = {k: round(max(now[k] - self._waited0[k], 0.0), 3) for k in now}
        out["gpu_exclusive"] = round(max(_lock("held_s", 0.0) - self._held0, 0.0), 3)
        out["gpu_memory_wait"] = round(max(_memory_waited() - self._memory0, 0.0), 3)
        out["other"] = round(max(total_s - spent, 0.0), 3)
        keys = [*PHASES, "compilation", "gpu_lock_wait", "gpu_exclusive", "gpu_memory_wait"]
        if parts := {k: round(v, 3) for k, v in sorted(self.parts.items(), key=lambda kv: -kv[1])
                     if v >= PART_MIN_S}:
            out["setup_parts"] = parts
            keys.append("setup_parts")
        seconds, counts = _lock("stretches", ({}, {}))
        if any(counts.values()):  # a cell that shared the GPU under the lock
            out["gpu_shared_stretches"] = {
                k: round(max(v - self._stretch0[0].get(k, 0.0), 0.0), 3)
                for k, v in seconds.items()}
            out["gpu_shared_stretch_count"] = {
                k: max(v - self._stretch0[1].get(k, 0), 0) for k, v in counts.items()}
            long = {k: round(v - self._long0.get(k, 0.0), 3)
                    for k, v in sorted(_lock("long_stretches", {}).items(), key=lambda kv: -kv[1])}
            out["gpu_shared_long"] = {k: v for k, v in long.items() if v > 0}
            joins = _lock("long_stretch_joins", {})
            out["gpu_shared_long_joins"] = {k: joins.get(k, 0) - self._joins0.get(k, 0)
                                            for k in out["gpu_shared_long"]}
            out["gpu_lock_set_aside"] = round(max(_lock("aside_s", 0.0) - self._aside0, 0.0), 3)
            keys += ["gpu_shared_stretches", "gpu_shared_stretch_count", "gpu_shared_long",
                     "gpu_shared_long_joins", "gpu_lock_set_aside"]
        return {k: out[k] for k in (*keys, "other")}


def _memory_waited() -> float:
    """Seconds this process has waited for its share of the GPU's memory (0.0 when the
    ledger never loaded)."""
    budget = sys.modules.get("gate_residual_matrix.contract.gpu_budget")
    return budget.waited_s() if budget is not None else 0.0


_NO_WAITS = {"shared": 0.0, "exclusive": 0.0, "drain": 0.0, "long": 0.0}


def _lock(figure: str, default):
    """This process's ``contract.gpu_lock.<figure>()`` so far: ``waited_s``, ``held_s``,
    ``stretches``, ``long_stretches``, ``long_stretch_joins`` or ``aside_s``; ``default`` when
    the lock module
    never loaded (a process that shared no GPU)."""
    lock = sys.modules.get("gate_residual_matrix.contract.gpu_lock")
    return getattr(lock, figure)() if lock is not None else default


_LONGEST_FIRST = ("gpu_shared_long", "setup_parts")
"""The phases' dicts that list their parts longest first (kept so when summed)."""


def add(a: dict | None, b: dict | None) -> dict | None:
    """Two reports' ``phases`` summed (a resumed cell: the interrupted run plus the rest);
    None when both are None."""
    if not a or not b:
        return a or b
    out: dict = {}
    for key in dict.fromkeys([*a, *b]):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) or isinstance(y, dict):
            x, y = (v if isinstance(v, dict) else {} for v in (x, y))  # an older format: dropped
            out[key] = {k: round(x.get(k, 0) + y.get(k, 0), 3)  # counts stay whole
                        for k in dict.fromkeys([*x, *y])}
            if key in _LONGEST_FIRST:
                out[key] = dict(sorted(out[key].items(), key=lambda kv: -kv[1]))
        else:
            out[key] = round((x or 0.0) + (y or 0.0), 3)
    return out
