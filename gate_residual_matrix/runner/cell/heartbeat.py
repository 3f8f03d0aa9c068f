"""A line while a long stretch of a cell runs: ``[cell] <label>: <doing>, <s> s`` when the
cell process has printed nothing for :data:`EVERY_S`, on stderr (the runner shows ``[cell]``
lines as they come), so that no case, however long, leaves the log silent. The cell's other
lines (precompile progress, case progress) call :func:`said`, so the silence is counted from
the last line of any of them, across a change of stage.

Example::

    with Heartbeat("add_rms_norm case 257") as beat:
        beat.doing = "compiled"
        ...
"""

from __future__ import annotations

import sys
import threading
import time

EVERY_S = 20.0
"""Seconds of silence after which a running stretch prints a line."""

_LAST_LINE = [time.perf_counter()]


def said() -> None:
    """Note that this process has just printed a line of progress."""
    _LAST_LINE[0] = time.perf_counter()


def quiet_for() -> float:
    """Seconds since this process last printed a line of progress (:func:`said`)."""
    return time.perf_counter() - _LAST_LINE[0]


class Heartbeat:
    """A daemon thread that says what ``doing`` holds whenever the process has been silent
    for ``every`` seconds, until the ``with`` block ends (nothing when it ends sooner).
    ``say(line)``: default, stderr."""

    def __init__(self, label: str, every: float = EVERY_S, say=None) -> None:
        self.label, self.every, self.doing = label, every, ""
        self._say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="heartbeat")

    def _beat(self) -> None:
        started = time.perf_counter()
        while not self._stop.wait(max(0.2, self.every - quiet_for())):
            if quiet_for() < self.every:  # another line came meanwhile
                continue
            doing = f": {self.doing}" if self.doing else ""
            self._say(f"[cell] {self.label}{doing}, {time.perf_counter() - started:.0f} s")
            said()

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
