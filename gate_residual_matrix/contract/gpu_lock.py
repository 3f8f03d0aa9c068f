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
``torch.cuda.synchronize``: its kernels are done, not only queued). Before it takes the
turnstile, a timing pass waits for the other processes' long stretches in flight to end,
stopping nobody (:mod:`contract.stretch_board`), so that what every process stands still
for is the end of short stretches only. Locks are ``flock(2)`` on open file
descriptions: the kernel drops them when a process dies, so a killed cell never wedges the
others.

A stretch that compiles (``torch.compile`` tracing or loading a graph, Triton building a
library's kernel) is CPU work for seconds: a timing pass that asked for the GPU would wait
for it with every other process standing still. So a process *steps aside* while it
compiles (:func:`step_aside`, :func:`step_back`, hooked in by :mod:`contract.compile_aside`):
the stretch so far ends (its kernels done), the lock file is let go, and taken again before
the compiled code runs. What runs on the GPU while a cell times is therefore at most what a
compiler itself launches while it compiles (none for a graph loaded from inductor's cache or
a Triton kernel built without autotuning). The stretches at least :data:`LONG_S` long are
recorded by where they began (:func:`long_stretches`).

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
from gate_residual_matrix.contract import stretch_board

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
_inside: set[int] = set()  # threads of this process inside shared(): flock is per process
_aside_thread: list[int | None] = [None]  # the thread whose stretch stepped aside
_WAITED = {"shared": 0.0, "exclusive": 0.0, "drain": 0.0, "long": 0.0}


_HELD = [0.0]

STRETCHES = (("<0.1s", 0.1), ("0.1-0.5s", 0.5), ("0.5-2s", 2.0), ("2-8s", 8.0),
             (">8s", float("inf")))
"""The buckets of :func:`stretches`: a name and the longest stretch it holds (seconds)."""
_STRETCH_S = {name: 0.0 for name, _ in STRETCHES}
_STRETCH_N = {name: 0 for name, _ in STRETCHES}
_since = [0.0]  # when this process last took the shared lock
_taken = [False]  # this process holds the lock file shared
_aside_since: list[float | None] = [None]  # stepped aside (step_aside) since
_ASIDE = [0.0]
_site = [""]  # where the stretch in progress began (_caller)
_doing = [""]

LONG_S = 2.0
"""A stretch at least this long is recorded by where it began (:func:`long_stretches`)."""
_LONG: dict[str, float] = {}
_LONG_JOINS: dict[str, int] = {}
_joins = [0]  # threads that joined the stretch in progress (it held by another thread)


def stretches() -> tuple[dict[str, float], dict[str, int]]:
    """This process's stretches of shared GPU work so far (from taking the lock file shared
    to letting it go, the closing synchronize included), by length (:data:`STRETCHES`):
    ``(seconds per bucket, count per bucket)``. A timing pass that asks for the GPU waits for
    the stretches in progress (its ``drain``): the long ones are what it waits for. Zeros
    without ``GATE_RESIDUAL_GPU_LOCK``."""
    return dict(_STRETCH_S), dict(_STRETCH_N)


def long_stretches() -> dict[str, float]:
    """Seconds of this process's stretches of at least :data:`LONG_S`, by where each began
    (the calling function, and what the process said it was doing: :func:`doing`), e.g.
    ``{"size_sweep (compiled)": 12.5}``: what a timing pass waited for longest."""
    return dict(_LONG)


def long_stretch_joins() -> dict[str, int]:
    """For the sites of :func:`long_stretches`: how many times a thread joined one of those
    stretches while another thread of this process held it (a hashing thread's copy, the
    main thread's next call). A joiner passes no turnstile, so a long stretch with many
    joins is a chain of overlapping holds; one with none is a single long hold."""
    return dict(_LONG_JOINS)


def _count_stretch(seconds: float) -> None:
    if seconds >= LONG_S:
        _LONG[_site[0]] = _LONG.get(_site[0], 0.0) + seconds
        _LONG_JOINS[_site[0]] = _LONG_JOINS.get(_site[0], 0) + _joins[0]
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
    "exclusive": s, "drain": s, "long": s}`` (0.0 each without ``GATE_RESIDUAL_GPU_LOCK``).
    ``drain`` is the part of ``exclusive`` spent after taking the turnstile, waiting for the
    other processes' current stretches of GPU work to end: every process that asked for the
    lock meanwhile stood still with it. ``long`` is the part of ``exclusive`` spent before
    it, waiting for the other processes' long stretches in flight to end while nobody stood
    still (:mod:`contract.stretch_board`)."""
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
    inside :func:`exclusive` it adds nothing. A thread that enters while its process has
    stepped aside (:func:`step_aside`) takes the lock for its own work, counted in the
    stretch that stepped aside, and lets it go again when it leaves."""
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
    me = threading.get_ident()
    with _mutex:
        if not _taken[0]:  # no thread of this process holds it (or it stepped aside)
            site = _site[0] if _aside_since[0] is not None else None
            _take(main, turnstile)
            if site is not None:  # it joins the stretch that stepped aside
                _site[0] = site
                _joins[0] += 1
        elif _inside:
            _joins[0] += 1
        _inside.add(me)  # once: a nested section goes through the thread's depth
    _state.depth = 1
    try:
        yield
    finally:
        _state.depth = 0
        with _mutex:
            _inside.discard(me)
            if not _inside:
                try:
                    _let_go(main)
                finally:
                    _back_from_aside()
            elif _aside_since[0] is not None and _inside == {_aside_thread[0]}:
                _let_go(main)  # only the thread still compiling is left: aside again


def _take(main: int, turnstile: int) -> None:
    """Take the lock file shared (under :data:`_mutex`), behind any cell that asked to time."""
    _flock(turnstile, fcntl.LOCK_EX, "shared")  # wait behind a cell that asked to time
    _flock(main, fcntl.LOCK_SH, "shared")
    fcntl.flock(turnstile, fcntl.LOCK_UN)
    _taken[0] = True
    _since[0] = time.perf_counter()
    _site[0] = _caller()
    _joins[0] = 0
    _on_board(stretch_board.began)


def _let_go(main: int) -> None:
    """End this process's stretch (under :data:`_mutex`): its queued kernels done, the lock
    file let go, the stretch counted. Nothing when it is not held (stepped aside)."""
    if not _taken[0]:
        return
    try:
        _drain()  # the stretch's queued kernels end before a cell may time
    finally:  # a CUDA error raised here must not keep every other cell from timing
        fcntl.flock(main, fcntl.LOCK_UN)
        _taken[0] = False
        _count_stretch(time.perf_counter() - _since[0])
        _on_board(stretch_board.ended)


def _on_board(mark) -> None:
    """``mark`` (:func:`contract.stretch_board.began` or ``ended``) for this process's
    stretch under the lock file in use."""
    lock_path = path()
    if lock_path is not None:
        mark(lock_path)


def step_aside() -> bool:
    """Let the lock file go in the middle of a stretch of shared GPU work, for CPU work that
    may take seconds (compiling: :mod:`contract.compile_aside`), so that no timing pass waits
    for it; :func:`step_back` takes it again. The stretch so far ends as :func:`shared`'s
    exit ends one (its kernels done, counted). Only when the lock is in use and one thread
    of this process is inside :func:`shared` (a hashing thread's copy in flight keeps the
    lock): the calling thread, or the main thread while the caller is inside no stretch of
    its own (autograd's engine thread compiling a backward for the main thread's call);
    returns whether it stepped aside."""
    lock_path = path()
    if lock_path is None:
        return False
    me = threading.get_ident()
    with _mutex:
        if len(_inside) != 1 or not _taken[0] or _aside_since[0] is not None:
            return False
        (holder,) = _inside
        if holder != me and not (holder == threading.main_thread().ident
                                 and not getattr(_state, "depth", 0)):
            return False  # another thread's stretch: its GPU work needs the lock
        _let_go(_fds(lock_path)[0])
        _aside_since[0] = time.perf_counter()
        _aside_thread[0] = holder
        return True


def step_back() -> None:
    """Take the lock file again after :func:`step_aside` (waiting behind a cell that asked to
    time, as :func:`shared` does), where a thread is still inside :func:`shared`; nothing
    when this process did not step aside. Safe to call more often than ``step_aside``:
    taking the lock early is always safe."""
    lock_path = path()
    if lock_path is None:
        return
    with _mutex:
        if _aside_since[0] is None:
            return
        _back_from_aside()
        if _inside and not _taken[0]:
            main, turnstile, _ = _fds(lock_path)
            site = _site[0]  # the same stretch goes on
            _take(main, turnstile)
            _site[0] = site


def _back_from_aside() -> None:
    """Count the time stepped aside (under :data:`_mutex`) and end it."""
    if _aside_since[0] is not None:
        _ASIDE[0] += time.perf_counter() - _aside_since[0]
        _aside_since[0] = None
        _aside_thread[0] = None


def aside_s() -> float:
    """Seconds this process's stretches of shared GPU work spent without the lock file,
    stepped aside for compiling (:func:`step_aside`)."""
    return _ASIDE[0]


def _caller() -> str:
    """Where the stretch being taken began: the first frame outside this module and
    contextlib, as ``function`` (with what the cell said it was doing: :func:`doing`)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in (__file__, contextlib.__file__):
        frame = frame.f_back
    where = frame.f_code.co_name if frame is not None else "?"
    return f"{where} ({_doing[0]})" if _doing[0] else where


def doing(what: str) -> None:
    """Say what this process's GPU work is about (an implementation's name), for the record
    of its long stretches (:func:`long_stretches`)."""
    _doing[0] = what


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
    left = stretch_board.WAIT_MAX_S
    if lock_path is not None:  # before COPIES: this process's hashing threads go on meanwhile
        left -= _wait_for_long(lock_path, left)
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
            _turnstile(lock_path, turnstile, left)  # new shared holders wait from now
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


def _wait_for_long(lock_path: str, max_s: float) -> float:
    """:func:`contract.stretch_board.wait_for_long`, its seconds counted as ``long`` and
    ``exclusive``; the seconds waited."""
    waited = stretch_board.wait_for_long(lock_path, max_s=max(max_s, 0.0))
    _WAITED["exclusive"] += waited
    _WAITED["long"] += waited
    return waited


def _turnstile(lock_path: str, turnstile: int, left: float) -> None:
    """Take the turnstile for a timing pass. Should another process's long stretch be in
    flight once it is taken (one that began while this pass waited for another's turnstile
    or the compile gate), it is let go and the wait for long stretches repeated
    (:func:`_wait_for_long`, nobody stopped), within ``left`` seconds in all."""
    while True:
        _flock(turnstile, fcntl.LOCK_EX, "exclusive")
        if left <= 0 or stretch_board.oldest_s(lock_path) < stretch_board.YOUNG_S:
            return
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        left -= max(_wait_for_long(lock_path, left), stretch_board.POLL_S)
