"""Whether another process's timing pass could take a GPU lock file now (a probe for the
tests of contract/gpu_lock.py and contract/compile_aside.py)."""

from __future__ import annotations

import fcntl
import os


def free_for_a_timer(lock) -> bool:
    """Whether an exclusive flock on ``lock`` would be granted now: the probe opens a file
    description of its own, so it conflicts with this process's hold too."""
    probe = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(probe)  # closing drops the probe's lock, if it got one
    return True
