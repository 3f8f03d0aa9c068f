"""A line while a long stretch of a cell runs: ``[cell] <label>: <doing>, <s> s`` at least
every :data:`EVERY_S`, on stderr (the runner shows ``[cell]`` lines as they come), so that no
case, however long, leaves the log silent.

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
"""Seconds between two lines of a running stretch."""


class Heartbeat:
    """A daemon thread that says what ``doing`` holds every ``every`` seconds until the
    ``with`` block ends (nothing when it ends sooner). ``say(line)``: default, stderr."""

    def __init__(self, label: str, every: float = EVERY_S, say=None) -> None:
        self.label, self.every, self.doing = label, every, ""
        self._say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="heartbeat")

    def _beat(self) -> None:
        started = time.perf_counter()
        while not self._stop.wait(self.every):
            doing = f": {self.doing}" if self.doing else ""
            self._say(f"[cell] {self.label}{doing}, {time.perf_counter() - started:.0f} s")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
