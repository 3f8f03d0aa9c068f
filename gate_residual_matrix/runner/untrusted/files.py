"""Reading a file that someone else may have made hostile: a regular file of bounded size,
never blocking on a FIFO or device. Used for matrix.yaml and report files. And
writing one so readers see the old or the new file, whole (:func:`write_text_atomic`), and
one run at a time in a folder (:func:`folder_lock`; :func:`locked` for the reports folder).

The file is opened non-blocking and its type taken from the open descriptor, so a FIFO is
refused without waiting for a writer and nothing can swap the file in between.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from gate_residual_matrix.runner.errors import ReportError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


class NotRegular(ValueError):
    """The path is not a regular file; ``kind`` says what it is (``"a FIFO"``...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        super().__init__(f"{kind}, not a regular file")


class TooLarge(ValueError):
    """The file has more than the allowed bytes; ``size`` is what it has (None: it grew
    past the limit while being read)."""

    def __init__(self, size: int | None, limit: int) -> None:
        self.size, self.limit = size, limit
        super().__init__(f"{'more' if size is None else size} bytes, more than {limit}")


def _kernel_devices() -> set[int]:
    """The devices of /proc and /sys: their files look regular but are kernel interfaces
    (``/proc/kmsg`` blocks and consumes the kernel log when read)."""
    found = set()
    for mount in ("/proc", "/sys"):
        try:
            found.add(os.stat(mount).st_dev)
        except OSError:
            continue
    return found


READ_TIMEOUT_S = 60.0
"""How long reading one file may take at most (a file on a stuck network mount)."""
_CHUNK = 1 << 20


def read_bounded(path: Path, limit: int, timeout_s: float = READ_TIMEOUT_S) -> bytes:
    """The bytes of ``path`` (symlinks followed) if it is a regular file of at most
    ``limit`` bytes, read in at most ``timeout_s`` seconds.

    The file stays non-blocking while it is read, so nothing here waits on a file that
    claims to be regular and is not (a read that would block is refused), and files of
    /proc and /sys are refused without a read.

    Raises:
        NotRegular: a directory, FIFO, socket, device, a kernel interface file, or a file
            whose read would block.
        TooLarge: more than ``limit`` bytes (by its size, or as read).
        TimeoutError: the read took more than ``timeout_s`` seconds.
        OSError: cannot be opened or read (a symlink loop: ``ELOOP``).
    """
    deadline = time.monotonic() + timeout_s
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegular(next((name for test, name in _KINDS if test(info.st_mode)),
                                  "not a regular file"))
        if info.st_dev in _kernel_devices():
            raise NotRegular("a kernel interface of /proc or /sys")
        if info.st_size > limit:
            raise TooLarge(info.st_size, limit)
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            try:
                chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
            except BlockingIOError:
                raise NotRegular("a special file (reading it would block)") from None
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading took more than {timeout_s:g} s")
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise TooLarge(None, limit)
    return data


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) so readers see the old or the new file, whole.

    A temporary ``.<name>.<pid>.<random>.tmp`` in the same directory is written, flushed
    and fsynced, renamed over ``path`` with ``os.replace`` and the directory fsynced. On
    any error the temporary file is removed and ``path`` is untouched.

    Raises:
        OSError: the directory cannot be written.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


_TEMP_RE = re.compile(r"^\..+\.\d+\.[0-9a-f]{8}\.tmp$")


def remove_stale_temp_files(directory: Path, min_age_s: float = 600.0) -> list[Path]:
    """Remove the temporary files of :func:`write_text_atomic` that a killed writer left.

    Only names of the form ``.<name>.<pid>.<8 hex>.tmp`` directly in ``directory`` and last
    modified at least ``min_age_s`` ago (a write takes milliseconds; a live writer's file is
    younger) are removed. Readers never see these files either way: they do not end in
    ``.json``. Returns the paths removed.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    now, removed = time.time(), []
    for path in directory.iterdir():
        if not _TEMP_RE.match(path.name):
            continue
        try:
            if path.is_file() and now - path.stat().st_mtime >= min_age_s:
                path.unlink()
                removed.append(path)
        except FileNotFoundError:
            continue
    return removed


_held: dict[str, int] = {}  # folders this process holds the lock of -> depth


class LockTimeout(OSError):
    """Another process held the folder's lock for longer than the wait allowed."""


@contextlib.contextmanager
def folder_lock(directory: Path, timeout_s: float = 600.0) -> Iterator[None]:
    """Hold ``directory``'s lock (``flock`` on the folder itself: no file is left) for the
    block: runs that write one reports folder at once read, merge and rename a report one
    at a time, so that neither loses the other's cases. Re-entrant within a process; waits up to
    ``timeout_s`` seconds for another process.

    Raises:
        LockTimeout: the lock stayed held for ``timeout_s`` seconds.
        OSError: the folder cannot be opened.
    """
    key = os.path.realpath(directory)
    if _held.get(key):
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"another run held its lock for more than "
                                      f"{timeout_s:g} s") from None
                time.sleep(0.05)
        _held[key] = 1
        try:
            yield
        finally:
            _held.pop(key, None)
    finally:
        os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def locked(reports_dir: Path) -> Iterator[None]:
    """:func:`folder_lock` on the reports folder, with an OS error (or a lock held too long)
    as a :class:`runner.errors.ReportError`."""
    held = contextlib.ExitStack()
    try:
        held.enter_context(folder_lock(reports_dir))
    except OSError as err:
        raise ReportError(f"{reports_dir}: cannot lock the reports folder: "
                          f"{err.strerror or err}") from err
    with held:
        yield
