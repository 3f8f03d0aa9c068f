"""Progress of the running cell, per case: case k of n, elapsed time, time left.

The cell process (host subprocess or container) prints one machine-readable line after each
case (:func:`progress_line`); the runner reads the cell's output as it comes and shows it
(:class:`ProgressView`): a live bar from ``rich`` when its console is a terminal, else one
plain line per case for logs (CI, ``tee``, a remote GPU host). ``GATE_RESIDUAL_PROGRESS=plain``
forces the plain lines, ``=off`` shows nothing. Every other line of the cell's output is
passed through unchanged.

Example::

    >>> line = progress_line("host-plain-cpu", {"case": 2, "of": 20, "id": "257",
    ...                      "case_s": 1.5, "elapsed_s": 9.0, "eta_s": 80.0})
    >>> parse(line)["id"]
    '257'
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import IO

from gate_residual_matrix import settings

PREFIX = "[progress] "
MODE_ENV = "GATE_RESIDUAL_PROGRESS"


def progress_line(cell_id: str, progress: dict) -> str:
    """The line a cell prints after a case: :data:`PREFIX` and JSON with the cell id and
    ``progress`` (case, of, id, case_s, elapsed_s, eta_s)."""
    return PREFIX + json.dumps({"cell": cell_id, **progress}, separators=(",", ":"))


def parse(line: str) -> dict | None:
    """The progress object of a line from :func:`progress_line`, or None for any other line
    (or a malformed one: progress is never worth an error)."""
    if not line.startswith(PREFIX):
        return None
    try:
        got = json.loads(line[len(PREFIX):])
    except ValueError:
        return None
    needed = ("cell", "case", "of", "id", "elapsed_s")
    return got if isinstance(got, dict) and all(k in got for k in needed) else None


def duration(seconds: float | None) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 02 min``; ``?`` for None."""
    if seconds is None:
        return "?"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def plain(p: dict) -> str:
    """One line for logs: ``[runner] host-plain-cpu: case 2/20 (257) 1.5 s; elapsed 9 s,
    about 1 min 20 s left``."""
    left = "done" if p["case"] >= p["of"] else f"about {duration(p.get('eta_s'))} left"
    return (f"[runner] {p['cell']}: case {p['case']}/{p['of']} ({p['id']}) "
            f"{p.get('case_s', 0):.1f} s; elapsed {duration(p['elapsed_s'])}, {left}")


class ProgressView:
    """Shows one cell's progress while its output streams in; ``with ProgressView(cell_id,
    cases) as view: view.feed(line)``.

    ``cases``: how many cases the cell runs (the bar's length). ``stream``: where plain
    lines and passed-through output go (default stdout). The rich bar is used when
    ``stream`` is a terminal and :data:`MODE_ENV` is not ``plain``/``off``.
    """

    def __init__(self, cell_id: str, cases: int, stream: IO[str] | None = None) -> None:
        self.cell_id, self.cases = cell_id, cases
        self.stream = stream or sys.stdout
        mode = settings.get(MODE_ENV)
        self.off = mode == "off"
        self.rich = (mode not in ("plain", "off") and hasattr(self.stream, "isatty")
                     and self.stream.isatty())
        self._bar = self._task = None

    def __enter__(self) -> ProgressView:
        if self.rich:
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeElapsedColumn,
                )
            except ImportError:
                self.rich = False
                return self
            bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                           MofNCompleteColumn(), TimeElapsedColumn(),
                           TextColumn("{task.fields[left]}"),
                           console=Console(file=self.stream), transient=False)
            bar.start()
            self._task = bar.add_task(self.cell_id, total=self.cases, left="")
            self._bar = bar
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def feed(self, line: str) -> None:
        """One line of the cell's output (without its newline): progress is shown, anything
        else is passed through (above the bar when there is one)."""
        p = parse(line)
        if p is None:
            if self._bar is not None:
                self._bar.console.print(line, markup=False, highlight=False)
            elif not self.off:
                print(line, file=self.stream, flush=True)
            return
        if self.off:
            return
        if self._bar is not None:
            left = "" if p["case"] >= p["of"] else f"~{duration(p.get('eta_s'))} left"
            self._bar.update(self._task, completed=p["case"], total=p["of"],
                             left=f"{p['id']}  {left}")
        else:
            print(plain(p), file=self.stream, flush=True)


class ShardTally:
    """The progress of one cell run as shards (:mod:`runner.backends.shards`): each shard's progress
    lines (case k of its n) turned into the cell's (cases done of all, the cell's elapsed
    time, the time left of the slowest shard). Thread-safe: one reader thread per shard
    calls :meth:`line`.

    Example::

        >>> t = ShardTally("c", [2, 3])
        >>> parse(t.line(1, progress_line("c", {"case": 1, "of": 3, "id": "9",
        ...     "case_s": 1.0, "elapsed_s": 1.0, "eta_s": 4.0})))["case"]
        1
    """

    def __init__(self, cell_id: str, sizes: list[int]) -> None:
        self.cell_id, self.sizes = cell_id, sizes
        self.done = [0] * len(sizes)
        self.eta: list[float | None] = [None] * len(sizes)
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()

    def line(self, shard: int, text: str) -> str:
        """The cell's progress line for shard ``shard``'s line ``text``; any other line
        unchanged."""
        p = parse(text)
        if p is None:
            return text
        with self._lock:
            self.done[shard] = int(p["case"])
            self.eta[shard] = p.get("eta_s") if p["case"] < p["of"] else 0.0
            left = [e for i, e in enumerate(self.eta)
                    if self.done[i] < self.sizes[i] and e is not None]
            unfinished = any(d < n for d, n in zip(self.done, self.sizes, strict=True))
            eta = (max(left) if left else None) if unfinished else 0.0
            return progress_line(self.cell_id, {
                "case": sum(self.done), "of": sum(self.sizes), "id": p["id"],
                "case_s": p.get("case_s", 0.0),
                "elapsed_s": round(time.perf_counter() - self._t0, 1), "eta_s": eta})
