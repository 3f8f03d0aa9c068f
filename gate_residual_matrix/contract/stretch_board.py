"""The stretches of shared GPU work in flight on one host, one small file per process.

A timing pass (:func:`contract.gpu_lock.exclusive`) stops every other process's new GPU
work, then waits for the stretches in flight (its *drain*). When one of those is long (a
compiled graph's first call, a library row's first launch), every process on the host
stands still for it. So each process that shares the GPU writes when its stretch in flight
began (:func:`began`, :func:`ended`), and a timing pass first waits, stopping nobody, until
no other process's stretch has been in flight :data:`YOUNG_S` or longer
(:func:`wait_for_long`, at most :data:`WAIT_MAX_S`); only then does it stop new stretches
and drain the short ones. What the pass measures is unchanged: it still starts with no
other process's GPU work in flight.

Each process's file is ``<lock file>.stretches/<pid>``: 8 bytes, the start of its stretch in
flight (``time.monotonic()``, one clock for every process on Linux), 0.0 when none. Its
process holds an exclusive ``flock(2)`` on it for as long as it lives, which the kernel drops
when the process dies however it dies: a file nobody holds is a dead process's, whatever its
pid now names, and is skipped and removed. Where the folder cannot be written, nothing is
recorded and a timing pass drains as it would without the board.

Example::

    began("/run/gpu.lock")        # this process took the lock shared
    ended("/run/gpu.lock")        # ... and let it go
    wait_for_long("/run/gpu.lock")  # in another process, before its timing pass: seconds waited
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import struct
import time

YOUNG_S = 0.25
"""A stretch in flight this long or longer is waited for without stopping anyone; a younger
one is left to the drain (nearly every stretch ends within it)."""
WAIT_MAX_S = 15.0
"""The longest a timing pass waits for long stretches before it drains as it would without
the board (a host whose processes run long stretches back to back must not starve it)."""
POLL_S = 0.01
"""How often a waiting pass reads the board."""

_START = struct.Struct("<d")
_mine: dict[str, tuple[int, int]] = {}  # lock path -> (pid, fd) of this process's file


def folder(lock_path: str) -> str:
    """The board's folder beside ``lock_path``."""
    return lock_path + ".stretches"


def _fd(lock_path: str) -> int | None:
    """This process's file (opened once per process; a forked child opens its own), or None
    where the folder cannot be written."""
    pid = os.getpid()
    held = _mine.get(lock_path)
    if held is not None and held[0] == pid:
        return held[1] if held[1] >= 0 else None
    name = os.path.join(folder(lock_path), str(pid))
    fd = _own(name)
    _mine[lock_path] = (pid, -1 if fd is None else fd)  # asked once per process
    if fd is not None:
        atexit.register(_remove, name, pid)
    return fd


def _own(name: str) -> int | None:
    """Open ``name`` as this process's entry, emptied, with the exclusive lock it holds for
    life; None where that fails. Never blocks: a reader removing an earlier, dead owner's
    file holds it for a moment (then this process makes a new one)."""
    try:
        os.makedirs(os.path.dirname(name), exist_ok=True)
    except OSError:
        return None
    for _ in range(50):
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_nlink:  # still the file that name names
                os.pwrite(fd, _START.pack(0.0), 0)
                return fd
        except OSError:  # BlockingIOError included: a reader has it
            pass
        os.close(fd)
        time.sleep(POLL_S)
    return None


def _remove(name: str, pid: int | None = None) -> None:
    """Unlink ``name`` (at exit: only in the process that made it, not a forked child)."""
    if pid is None or pid == os.getpid():
        with contextlib.suppress(OSError):
            os.unlink(name)


def _write(lock_path: str, start: float) -> None:
    fd = _fd(lock_path)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.pwrite(fd, _START.pack(start), 0)


def began(lock_path: str) -> None:
    """This process's stretch of shared GPU work under ``lock_path`` began now."""
    _write(lock_path, time.monotonic())


def ended(lock_path: str) -> None:
    """This process's stretch under ``lock_path`` ended (it holds the lock no more)."""
    _write(lock_path, 0.0)


def oldest_s(lock_path: str) -> float:
    """How long the longest-running stretch in flight of any other live process has run
    (seconds; 0.0 when none is in flight or there is no board). Removes the files of
    processes that are gone (files nobody holds)."""
    where = folder(lock_path)
    try:
        names = os.listdir(where)
    except OSError:
        return 0.0
    now, me, oldest = time.monotonic(), str(os.getpid()), 0.0
    for name in names:
        if name != me:
            oldest = max(oldest, _age(os.path.join(where, name), now))
    return oldest


def _age(entry: str, now: float) -> float:
    """How long the stretch in flight that ``entry`` records has run (0.0 when none, when
    the file is unreadable or foreign, or when its process is gone: then it is removed)."""
    try:
        fd = os.open(entry, os.O_RDONLY)
    except OSError:
        return 0.0
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its process holds it (or another reader, for a moment)
            raw = os.pread(fd, _START.size, 0)
            start = _START.unpack(raw)[0] if len(raw) == _START.size else 0.0
            return now - start if start > 0 else 0.0
        opened, named = os.fstat(fd), os.stat(entry)
        if (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino):
            _remove(entry)  # nobody holds it: a dead process's (or not ours)
        return 0.0
    except OSError:
        return 0.0
    finally:
        os.close(fd)


def wait_for_long(lock_path: str, max_s: float = WAIT_MAX_S) -> float:
    """Wait, stopping no other process, until no other process's stretch has been in flight
    :data:`YOUNG_S` or longer, or ``max_s`` has passed; the seconds waited."""
    t0 = time.monotonic()
    while oldest_s(lock_path) >= YOUNG_S and time.monotonic() - t0 < max_s:
        time.sleep(POLL_S)
    return time.monotonic() - t0
