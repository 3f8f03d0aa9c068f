"""Reading a file that someone else may have made hostile: a regular file of bounded size,
never blocking on a FIFO or device (issue 16). Used for matrix.yaml and report files.

The file is opened non-blocking and its type taken from the open descriptor, so a FIFO is
refused without waiting for a writer and nothing can swap the file in between.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

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


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of ``path`` (symlinks followed) if it is a regular file of at most
    ``limit`` bytes.

    Raises:
        NotRegular: a directory, FIFO, socket or device.
        TooLarge: more than ``limit`` bytes (by its size, or as read).
        OSError: cannot be opened or read (a symlink loop: ``ELOOP``).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegular(next((name for test, name in _KINDS if test(info.st_mode)),
                                  "not a regular file"))
        if info.st_size > limit:
            raise TooLarge(info.st_size, limit)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            fd = -1
            data = f.read(limit + 1)
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > limit:
        raise TooLarge(None, limit)
    return data
