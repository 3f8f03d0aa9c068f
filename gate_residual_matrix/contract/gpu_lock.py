"""One GPU, several cells at once, and timings that see the GPU alone.

Cells of different modes share nothing but the device, so a GPU host can run several at
once (``gpu-host --jobs``), and one cell can run as several processes (its
shards, :mod:`runner.backends.shards`): their bits do not depend on it. Their timings would: a
kernel timed while another process's kernels run is slower than alone. So when
``GATE_RESIDUAL_GPU_LOCK`` names a lock file, every cell process on the host takes it

* **shared** around each stretch of GPU work that is not timed (:func:`shared`: inputs to
  the device, one call of an implementation with its checks, a comparison, the accuracy
  figures of one implementation, waiting for compile workers), and
* **exclusive** around a case's timing loops (:func:`exclusive`),

so no other process's kernel runs while a cell times; and while the GPU host's compile
workers run beside the cells (:func:`compiling`, a third lock file), no cell times. Writers
go first: a cell waiting for the exclusive lock holds a turnstile (a second lock file) that
new shared holders must pass, so the shared holders drain and the timing starts after at
most one stretch of each other process's GPU work (a stretch ends with
``torch.cuda.synchronize``: its kernels are done, not only queued). Locks are ``flock(2)``
on open file descriptions: the kernel drops them when a process dies, so a killed cell
never wedges the others.

Every wait for the lock file is counted (:func:`waited_s`): the seconds a process's threads
waited for other cells, which the report's ``phases`` records as ``gpu_lock_wait``; and so is
the time it held the GPU alone (:func:`held_s`, ``phases.gpu_exclusive``), during which every
other process's GPU work waited.

Within one process the hashing threads' device-to-host copies (:mod:`contract.compare`) take
:data:`COPIES` too, which :func:`exclusive` holds: the cell's own copies stay out of its
timings as well. Without ``GATE_RESIDUAL_GPU_LOCK`` both context managers only take
:data:`COPIES`. The report records the setting (``environment.gpu_lock``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import threading
import time
from collections.abc import Iterator

from gate_residual_matrix import settings

ENV = "GATE_RESIDUAL_GPU_LOCK"

#: Held by a hashing thread while it copies a device tensor to the host, and by
#: :func:`exclusive` for the whole timing stretch.
COPIES = threading.RLock()

_state = threading.local()
_FILES: dict[str, tuple[int, int]] = {}


def path() -> str | None:
    """The lock file this process's cells share, or None (no other cell to wait for)."""
    return settings.get(ENV)


_opening = threading.Lock()


def _fds(lock_path: str) -> tuple[int, int, int]:
    """(main, turnstile, compile gate) descriptors of ``lock_path``, opened once per process,
    whichever thread asks first: flock(2) locks belong to an open file description, so two
    threads with descriptors of their own would wait for each other."""
    with _opening:
        if lock_path not in _FILES:
            _FILES[lock_path] = tuple(
                os.open(lock_path + suffix, os.O_RDWR | os.O_CREAT, 0o666)
                for suffix in ("", ".turnstile", ".compiling"))
        return _FILES[lock_path]


@contextlib.contextmanager
def compiling(lock_path: str) -> Iterator[None]:
    """Held while compile workers run beside the cells that share ``lock_path`` (the GPU
    host's compile-ahead): no cell takes the GPU alone (:func:`exclusive` waits) until it
    ends, since the workers' compiling loads the CPUs and their calls and autotuning run
    kernels on the GPU, outside the shared lock. The cells' other GPU work goes on."""
    gate = _fds(lock_path)[2]
    fcntl.flock(gate, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(gate, fcntl.LOCK_UN)


_mutex = threading.Lock()
_holders = [0]  # threads of this process inside shared(): flock is per process, not thread
_WAITED = {"shared": 0.0, "exclusive": 0.0, "drain": 0.0}


_HELD = [0.0]

STRETCHES = (("<0.1s", 0.1), ("0.1-0.5s", 0.5), ("0.5-2s", 2.0), ("2-8s", 8.0),
             (">8s", float("inf")))
"""The buckets of :func:`stretches`: a name and the longest stretch it holds (seconds)."""
_STRETCH_S = {name: 0.0 for name, _ in STRETCHES}
_STRETCH_N = {name: 0 for name, _ in STRETCHES}
_since = [0.0]  # when this process last took the shared lock


def stretches() -> tuple[dict[str, float], dict[str, int]]:
    """This process's stretches of shared GPU work so far (from taking the lock file shared
    to letting it go, the closing synchronize included), by length (:data:`STRETCHES`):
    ``(seconds per bucket, count per bucket)``. A timing pass that asks for the GPU waits for
    the stretches in progress (its ``drain``): the long ones are what it waits for. Zeros
    without ``GATE_RESIDUAL_GPU_LOCK``."""
    return dict(_STRETCH_S), dict(_STRETCH_N)


def _count_stretch(seconds: float) -> None:
    for name, bound in STRETCHES:
        if seconds < bound:
            _STRETCH_S[name] += seconds
            _STRETCH_N[name] += 1
            return


def held_s() -> float:
    """Seconds this process has held the lock file exclusively so far (0.0 without
    ``GATE_RESIDUAL_GPU_LOCK``)."""
    return _HELD[0]


def waited_s() -> dict[str, float]:
    """Seconds this process has waited for the lock file so far: ``{"shared": s,
    "exclusive": s, "drain": s}`` (0.0 each without ``GATE_RESIDUAL_GPU_LOCK``). ``drain``
    is the part of ``exclusive`` spent after taking the turnstile, waiting for the other
    processes' current stretches of GPU work to end: every process that asked for the lock
    meanwhile stood still with it."""
    return dict(_WAITED)


def _flock(fd: int, op: int, kind: str, also: str | None = None) -> None:
    """``flock(fd, op)``, the seconds it blocked added to :data:`_WAITED` ``[kind]`` (and
    ``[also]``, when given)."""
    t0 = time.perf_counter()
    fcntl.flock(fd, op)
    waited = time.perf_counter() - t0
    _WAITED[kind] += waited
    if also is not None:
        _WAITED[also] += waited


@contextlib.contextmanager
def shared() -> Iterator[None]:
    """GPU work that other cells may overlap, but no other cell's timing. Re-entrant and
    safe from any thread (the process holds the file lock while any thread is inside);
    inside :func:`exclusive` it adds nothing."""
    lock_path = path()
    depth = getattr(_state, "depth", 0)
    if lock_path is None or depth:
        _state.depth = depth + 1
        try:
            yield
        finally:
            _state.depth = depth
        return
    main, turnstile, _ = _fds(lock_path)
    with _mutex:
        if _holders[0] == 0:
            _flock(turnstile, fcntl.LOCK_EX, "shared")  # wait behind a cell that asked to time
            _flock(main, fcntl.LOCK_SH, "shared")
            fcntl.flock(turnstile, fcntl.LOCK_UN)
            _since[0] = time.perf_counter()
        _holders[0] += 1
    _state.depth = 1
    try:
        yield
    finally:
        _state.depth = 0
        with _mutex:
            _holders[0] -= 1
            if _holders[0] == 0:
                _drain()  # the stretch's queued kernels end before a cell may time
                fcntl.flock(main, fcntl.LOCK_UN)
                _count_stretch(time.perf_counter() - _since[0])


def _drain() -> None:
    """Wait for this process's queued GPU work (``torch.cuda.synchronize``) when torch has
    initialised CUDA here; nothing otherwise (a CPU cell, or no CUDA call yet)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()


@contextlib.contextmanager
def exclusive() -> Iterator[None]:
    """The GPU to this cell's timing loops alone: no other cell's GPU work (with
    ``GATE_RESIDUAL_GPU_LOCK``) and none of this cell's hashing copies. Must not be entered
    inside :func:`shared` (raises ``RuntimeError``: the two would wait for each other)."""
    if getattr(_state, "depth", 0):
        raise RuntimeError("gpu_lock.exclusive() inside shared(): release the shared lock first")
    lock_path = path()
    with COPIES:
        if lock_path is None:
            _state.depth = 1
            try:
                yield
            finally:
                _state.depth = 0
            return
        main, turnstile, gate = _fds(lock_path)
        _flock(gate, fcntl.LOCK_SH, "exclusive")  # no compile workers beside (compiling())
        try:
            _flock(turnstile, fcntl.LOCK_EX, "exclusive")  # new shared holders wait from now
            try:
                # the current ones end their stretch
                _flock(main, fcntl.LOCK_EX, "exclusive", also="drain")
                _state.depth = 1
                since = time.perf_counter()
                try:
                    yield
                finally:
                    _state.depth = 0
                    _HELD[0] += time.perf_counter() - since
                    fcntl.flock(main, fcntl.LOCK_UN)
            finally:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
