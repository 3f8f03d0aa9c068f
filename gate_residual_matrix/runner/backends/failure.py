"""How a cell that wrote no report ended: one classifier for every backend.

A backend that runs a cell (a process on the host, a container, a cluster task) and finds no
report of that run says how the cell ended as an :class:`Ending`: its exit code, its log,
whether the runner's timeout stopped it, and what the runtime or the kernel said about
memory. :func:`classify` turns that into a :class:`~runner.status.Status` (``timeout``,
``oom`` or ``error``) by one rule for all of them, and :func:`explain` into the one-line
reason the report carries, in the words of the backend (``process``: the host's cell
process, ``container``: the docker backend's container).

``oom`` needs evidence: the runtime said so (docker's ``State.OOMKilled``, Ray's
``OutOfMemoryError``), the log has an out-of-memory message, or the process died of SIGKILL
while the kernel's OOM-kill count (/proc/vmstat ``oom_kill``) grew. A bare SIGKILL is
``error``: the OOM killer, a user's ``kill -9`` and a container runtime all send it.

Example::

    >>> classify(Ending(exit_code=1, log="torch.OutOfMemoryError: CUDA out of memory"))
    <Status.OOM: 'oom'>
    >>> explain(Ending(exit_code=3), 60.0)
    'cell process exited with code 3 and wrote no report'
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Literal

from gate_residual_matrix.runner.status import Status

__all__ = ["LOG_TAIL_CHARS", "Ending", "Where", "classify", "explain", "log_tail",
           "oom_kill_count"]

LOG_TAIL_CHARS = 6000
"""The characters of a cell's (or a build's) log kept in its report: the end of it."""

Where = Literal["process", "container"]
"""What ran the cell, for the wording of :func:`explain`."""

_KILLED: dict[Where, str] = {"process": "the cell's process group was killed",
                             "container": "the container was killed"}


@dataclass(frozen=True)
class Ending:
    """How a cell's process or container ended, as the backend saw it.

    ``exit_code``: the process's return code (negative: killed by that signal) or the
    container's exit code; None when unknown. ``log``: its output. ``timed_out``: the
    runner's cell timeout stopped it. ``oom_killed``: the runtime says memory ran out
    (docker's ``OOMKilled``, Ray's memory monitor). ``oom_kills``: the kernel's OOM-kill
    count before and after the run (:func:`oom_kill_count`; None where unreadable).
    """

    exit_code: int | None
    log: str = ""
    timed_out: bool = False
    oom_killed: bool = False
    oom_kills: tuple[int | None, int | None] = (None, None)

    @property
    def oom_kill_grew(self) -> bool | None:
        """Whether the kernel's OOM killer fired during the run; None when unknown."""
        before, after = self.oom_kills
        if before is None or after is None:
            return None
        return after > before


def oom_kill_count() -> int | None:
    """The kernel's count of OOM-killer kills since boot (``oom_kill`` in /proc/vmstat,
    Linux >= 4.13, memory-cgroup kills included), or None where it cannot be read."""
    try:
        with open("/proc/vmstat", encoding="ascii") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def log_tail(text: str, limit: int = LOG_TAIL_CHARS) -> str:
    """The last ``limit`` characters of ``text``, marked with ``…`` when cut."""
    return text if len(text) <= limit else "…" + text[-limit:]


def _out_of_memory_logged(log: str) -> bool:
    lowered = log.lower()
    return "out of memory" in lowered or "outofmemoryerror" in lowered


def classify(ending: Ending) -> Status:
    """The status of a cell that wrote no report (or stopped after some cases): timeout,
    oom or error (see the module docstring for the evidence ``oom`` needs)."""
    if ending.timed_out:
        return Status.TIMEOUT
    if ending.oom_killed or _out_of_memory_logged(ending.log):
        return Status.OOM
    if ending.exit_code == -signal.SIGKILL and ending.oom_kill_grew:
        return Status.OOM
    return Status.ERROR


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def explain(ending: Ending, timeout_s: float, where: Where = "process") -> str:
    """One line saying how a cell that wrote no report ended, for its report's ``reason``.

    ``timeout_s``: the cell timeout (named when it ran out). A process killed by SIGKILL
    gets what /proc/vmstat showed, since SIGKILL alone is ambiguous.

    Example::

        >>> explain(Ending(exit_code=137, oom_killed=True), 60.0, "container")
        'out of memory: the container was OOM-killed (exit code 137) and wrote no report'
    """
    code = ending.exit_code
    if ending.timed_out:
        return (f"timed out: no report after the cell timeout of {timeout_s:g} s; "
                f"{_KILLED[where]}")
    if where == "container":
        if classify(ending) is Status.OOM:
            return (f"out of memory: the container was OOM-killed (exit code {code}) and "
                    "wrote no report")
        return f"container exited with code {code} and wrote no report"
    if code is None or code >= 0:
        return f"cell process exited with code {code} and wrote no report"
    reason = (f"cell process was killed by {_signal_name(-code)} (exit code {code}) and wrote "
              "no report")
    if code != -signal.SIGKILL:
        return reason
    before, after = ending.oom_kills
    grew = ending.oom_kill_grew
    if grew is None:
        return (f"{reason}; SIGKILL is ambiguous: the kernel's OOM killer or another process "
                "sent it (/proc/vmstat oom_kill unreadable: cannot tell which)")
    if grew:
        return (f"{reason}; the kernel's OOM killer fired meanwhile (/proc/vmstat oom_kill "
                f"{before} -> {after}), so most likely out of memory")
    return (f"{reason}; not the runner's timeout and no OOM kill was recorded (/proc/vmstat "
            f"oom_kill stayed {before}): another process or a hard limit sent it")
