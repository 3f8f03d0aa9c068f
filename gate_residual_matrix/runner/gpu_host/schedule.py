"""Cells at once on one GPU host: a queue that starts each cell when its CPUs and its GPU
memory are free.

A cuda cell runs as one process per shard (:mod:`runner.backends.shards`), and each of those
processes is mostly Python on one CPU while the GPU waits for it. So the ``modes`` step runs
several cells at once, each taking as many of the host's CPUs as it has shards and an
estimate of its GPU memory: a cell starts when at most ``jobs`` cells run, its shards fit in
the CPUs left and its memory in the memory left (a cell that needs more than the host has
starts alone). Cells are taken in the order given, the first that fits first, so a caller
that lists the largest cells first gets longest-processing-time-first scheduling, which keeps
the last cells from running on an otherwise idle host, and small cells fill in beside a
large one. A unit that smaller ones have passed :data:`MAX_PASSED` times goes next: no other
starts before it (without that, two small cells at a time beside one large cell could keep
the memory of another large one from ever coming free). A unit that is not ready yet (its
mode still compiling) is skipped until it is. Nothing here knows what a cell is: a
:class:`Unit` is a name, a CPU count, a memory figure, a readiness test and a function.

Each unit's start and end are recorded (seconds since :func:`run_queue` began), for the run's
timeline. Example::

    >>> done = run_queue([Unit("a", 2, lambda: "A"), Unit("b", 2, lambda: "B")], jobs=2, cpus=4)
    >>> [(r.name, r.result) for r in done]
    [('a', 'A'), ('b', 'B')]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

MAX_PASSED = 2
"""How many units may start ahead of one that does not fit yet."""
POLL_S = 0.5
"""How often the queue asks the units that were not ready whether they are now."""


@dataclass
class Unit:
    """One cell's turn: ``name`` (for the timeline), ``cpus`` it takes (>= 1), ``memory`` (its
    estimated GPU memory, MiB; 0: not counted) and ``run``, called without arguments in a
    thread of its own; ``ready`` (None: always), whether it may start yet (its compiled
    graphs are there): a unit not ready is skipped, neither started nor passed over. After
    :func:`run_queue`: ``result`` (what ``run`` returned), ``error`` (what it raised, or
    None), ``started_s`` and ``ended_s`` (seconds since the queue began; None for a unit that
    never started)."""

    name: str
    cpus: int
    run: Callable[[], object]
    result: object = None
    error: BaseException | None = None
    started_s: float | None = None
    ended_s: float | None = None
    extra: dict = field(default_factory=dict)
    memory: int = 0
    ready: Callable[[], bool] | None = None


def run_queue(units: Sequence[Unit], *, jobs: int, cpus: int,
              memory: int | None = None) -> list[Unit]:
    """Run ``units`` as described in the module docstring; the units, in their order.

    ``jobs``: at most this many at once (>= 1); ``cpus``: the CPUs they share (>= 1);
    ``memory``: the GPU memory (MiB) their estimates may add up to (None: not counted). A
    unit that raises keeps its error in ``error``; the others go on. Units are daemon
    threads: an interrupted run does not wait for them.
    """
    jobs, cpus = max(1, jobs), max(1, cpus)
    pending = list(units)
    running: list[Unit] = []
    changed = threading.Condition()
    began = time.monotonic()

    def body(unit: Unit) -> None:
        try:
            unit.result = unit.run()
        except BaseException as err:  # kept for the caller; the queue goes on
            unit.error = err
        finally:
            with changed:
                unit.ended_s = round(time.monotonic() - began, 3)
                running.remove(unit)
                changed.notify_all()

    def fits(unit: Unit) -> bool:
        used = sum(u.cpus for u in running)
        held = sum(u.memory for u in running)
        return not running or (len(running) < jobs and used + unit.cpus <= cpus
                               and (memory is None or held + unit.memory <= memory))

    passed = {id(u): 0 for u in units}

    def ready(unit: Unit) -> bool:
        return unit.ready is None or unit.ready()

    def next_unit() -> Unit | None:
        for u in pending:
            if not ready(u):
                continue
            if fits(u):
                return u
            if passed[id(u)] >= MAX_PASSED:
                return None  # it goes next: nothing starts ahead of it any more
        return None

    with changed:
        while pending or running:
            started = next_unit()
            if started is None:  # a unit may become ready without a unit ending
                changed.wait(timeout=POLL_S if any(u.ready for u in pending) else None)
                continue
            for u in pending[:pending.index(started)]:
                if ready(u):
                    passed[id(u)] += 1
            pending.remove(started)
            running.append(started)
            started.started_s = round(time.monotonic() - began, 3)
            threading.Thread(target=body, args=(started,), daemon=True,
                             name=f"cell {started.name}").start()
    return list(units)


def most_at_once(units: Sequence[Unit]) -> int:
    """The most units that ran at the same time (0 when none started): for each unit's start,
    itself and the others that had started and not yet ended (one that ended as it started
    does not count beside it).

    >>> most_at_once([Unit("a", 1, print, started_s=0, ended_s=2),
    ...               Unit("b", 1, print, started_s=1, ended_s=3),
    ...               Unit("c", 1, print, started_s=2, ended_s=4)])
    2
    """
    ran = [u for u in units if u.started_s is not None and u.ended_s is not None]
    return max((1 + sum(1 for v in ran if v is not u and v.started_s <= u.started_s < v.ended_s)
                for u in ran), default=0)
