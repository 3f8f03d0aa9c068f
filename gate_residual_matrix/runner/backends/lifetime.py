"""A cell process never outlives its runner or its deadline.

Two guards, one on each side of the process boundary:

* :func:`die_with_parent` runs in the child between ``fork`` and ``exec`` (``preexec_fn``)
  and asks Linux to SIGKILL it when the parent dies (``prctl(PR_SET_PDEATHSIG)``, man 2
  prctl). It covers a runner killed by SIGKILL, where no Python clean-up can run.
* :func:`start_watchdog` runs in the cell process: a daemon thread that ends the process
  (exit code :data:`DEADLINE_EXIT`) once the deadline in :data:`DEADLINE_ENV` has passed,
  or once the parent named in :data:`PARENT_ENV` is gone (where the parent-death signal is
  not available, or the cell runs in a container that the runner starts). A cell that
  stops this way keeps the cases it finished: it writes a ``partial`` report after each
  case (:mod:`runner.cell.run`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

from gate_residual_matrix import settings

DEADLINE_ENV = "GATE_RESIDUAL_CELL_DEADLINE"
"""Seconds since the epoch after which the cell process exits by itself."""
PARENT_ENV = "GATE_RESIDUAL_PARENT_PID"
"""The runner's pid; the cell exits when its parent process is no longer that one."""
DEADLINE_EXIT = 124
"""The exit code of a cell that reached its deadline (as timeout(1) uses)."""
PARENT_EXIT = 129
"""The exit code of a cell whose runner went away (128 + SIGHUP, as a shell reports it)."""
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a child before ``exec``: SIGKILL me when my parent dies (Linux only; a no-op
    elsewhere). Safe between fork and exec: one system call, no allocation in Python."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def child_environment(timeout_s: float) -> dict[str, str]:
    """The variables that bound a cell process started now with ``timeout_s``: its deadline
    (a little after the runner's own, so that the runner's timeout, which kills the process
    group and records ``timeout``, normally fires first) and the runner's pid."""
    return {DEADLINE_ENV: f"{time.time() + timeout_s + 5.0:.3f}", PARENT_ENV: str(os.getpid())}


def _parent_gone(parent: int | None) -> bool:
    return parent is not None and os.getppid() != parent


def start_watchdog(*, poll_s: float = 0.5) -> threading.Thread | None:
    """In the cell process: start the guard thread when :data:`DEADLINE_ENV` or
    :data:`PARENT_ENV` is set (the backends set both); None when neither is. Malformed values
    are ignored (the runner's own timeout still applies)."""
    deadline = settings.get(DEADLINE_ENV, strict=False)
    parent = settings.get(PARENT_ENV, strict=False)
    if parent is not None and os.getppid() != parent:
        parent = None  # in a container the runner is not our parent: the deadline serves
    if deadline is None and parent is None:
        return None

    def guard() -> None:
        while True:
            if deadline is not None and time.time() > deadline:
                print(f"[cell] deadline passed: exiting with {DEADLINE_EXIT}; the finished "
                      "cases are in the partial report", flush=True)
                os._exit(DEADLINE_EXIT)
            if _parent_gone(parent):
                os._exit(PARENT_EXIT)
            time.sleep(poll_s)

    thread = threading.Thread(target=guard, name="cell-watchdog", daemon=True)
    thread.start()
    return thread
