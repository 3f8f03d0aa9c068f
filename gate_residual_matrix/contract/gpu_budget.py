"""GPU memory shared out among the processes of one GPU host, case by case.

A cell process holds most of its memory only while it runs its largest case. Counting a
cell's peak for its whole life (what the GPU host's queue did) left most of the GPU's memory
unused while the cells ran (docs/performance.md, "Memory by the case"). So where
``GATE_RESIDUAL_GPU_BUDGET_MIB`` (the MiB the cells may hold together) and
``GATE_RESIDUAL_GPU_LOCK`` are set, every cell process writes what it holds in a ledger
beside the lock file (``<lock>.budget``, JSON under ``flock(2)``):

* its **base** for its whole life (:data:`BASE_MIB`: the CUDA context, the caching
  allocator's slack, the libraries' workspaces),
* around each **case**, :data:`COPIES` times the case's input bytes (its inputs, the clones
  each call takes, the outputs and gradients it keeps for hashing, comparisons, pairs and the
  float64 reference's),
* around its **timing pass**, :data:`TIMING_COPIES` times the input bytes of the cases it
  times (:mod:`runner.cell.timing_pass`),

and the GPU host's compile-ahead holds its workers' share while they run. A request waits
until it fits beside what the others hold, first come first served (a large case is never
passed over for ever); a request larger than the budget left beside the bases goes ahead
once no case holds memory. Entries of processes that have died are dropped whenever the
ledger is read, so a killed cell frees its share. Without the two settings :func:`reserve`
does nothing. The seconds a process waited are :func:`waited_s` (``phases.gpu_memory_wait``).

The figures come from the GPU memory in use while cells ran on an H200 (docs/performance.md,
"Cells side by side" and "Memory by the case"), with room to spare: a figure too low would
let an implementation run out of memory (an ``oom`` row), one too high only makes cases
wait.

Example::

    with reserve(case_mib(x.tensors.values()), "case"):
        run_the_case()
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import time
from collections.abc import Iterable, Iterator

from gate_residual_matrix import settings

ENV = "GATE_RESIDUAL_GPU_BUDGET_MIB"
BASE_MIB = 3072
"""What a cell process holds on the GPU whatever its cases (MiB)."""
WORKER_MIB = 3584
"""What a compile worker holds on the GPU at most (MiB): its context and one graph call's
inputs and outputs at the largest case's size."""
COPIES = 10
"""A case's peak in multiples of its input bytes."""
TIMING_COPIES = 4
"""A timing pass's peak in multiples of the input bytes of the cases it times: the inputs
back on the device, a loop's clones of them, a call's outputs and gradients."""
POLL_S = 0.1
"""How often a waiting request reads the ledger again."""

_WAITED = [0.0]
_keys = itertools.count()


def waited_s() -> float:
    """Seconds this process has waited for GPU memory so far."""
    return _WAITED[0]


def budget_mib() -> int | None:
    """The MiB the cells of this host may hold together (``GATE_RESIDUAL_GPU_BUDGET_MIB``),
    or None (no ledger)."""
    return settings.get(ENV, strict=False)


def mib_of(tensors: Iterable, copies: int) -> int:
    """``copies`` times the bytes of ``tensors`` (torch tensors), in MiB, rounded up."""
    total = sum(t.numel() * t.element_size() for t in tensors)
    return -(-copies * total // 2**20)


@contextlib.contextmanager
def reserve(mib: int, kind: str, *, lock: str | None = None,
            budget: int | None = None) -> Iterator[None]:
    """Hold ``mib`` of the host's GPU memory budget for the ``with`` block, recorded as
    ``kind`` (``base``, ``case``, ``timings``, ``precompile``); waits until it fits (see the
    module docstring). ``lock`` and ``budget`` default to the settings; nothing is held
    without them, or for ``mib`` <= 0."""
    from gate_residual_matrix.contract import gpu_lock

    lock = lock or gpu_lock.path()
    budget = budget if budget is not None else budget_mib()
    if lock is None or budget is None or mib <= 0:
        yield
        return
    ledger = lock + ".budget"
    key = f"{os.getpid()}:{kind}:{next(_keys)}"
    _acquire(ledger, key, int(mib), budget)
    try:
        yield
    finally:
        with _book(ledger) as book:
            book["held"].pop(key, None)


def _acquire(ledger: str, key: str, mib: int, budget: int) -> None:
    started, asked = time.perf_counter(), time.time()
    try:
        while True:
            with _book(ledger) as book:
                book["waiting"].setdefault(key, [asked, mib])
                head = min(book["waiting"], key=lambda k: (book["waiting"][k][0], k))
                held = sum(book["held"].values())
                cases = any(k.split(":")[1] != "base" for k in book["held"])
                if head == key and (held + mib <= budget or not cases):
                    del book["waiting"][key]
                    book["held"][key] = mib
                    return
            time.sleep(POLL_S)
    except BaseException:  # interrupted while waiting, or as it was granted: leave both
        with _book(ledger) as book:
            book["waiting"].pop(key, None)
            book["held"].pop(key, None)
        raise
    finally:
        _WAITED[0] += time.perf_counter() - started


@contextlib.contextmanager
def _book(ledger: str) -> Iterator[dict]:
    """The ledger ``{"held": {key: mib}, "waiting": {key: [asked, mib]}}`` under an
    exclusive ``flock`` of ``<ledger>.lock``, the entries of dead processes dropped; written
    back at the end when it changed, whole (a temporary file renamed over it), so a process
    stopped halfway never leaves a truncated ledger."""
    fd = os.open(ledger + ".lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            with open(ledger, encoding="utf-8") as f:
                raw = json.load(f)
        except (OSError, ValueError):
            raw = {}
        book = {part: {k: v for k, v in (raw.get(part) or {}).items() if _alive(k)}
                for part in ("held", "waiting")}
        before = json.dumps(raw, sort_keys=True)
        yield book
        if json.dumps(book, sort_keys=True) != before:
            tmp = f"{ledger}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(book, f)
            os.replace(tmp, ledger)
    finally:
        os.close(fd)  # closing drops the flock


def clear(lock: str) -> None:
    """Forget every entry of the ledger beside ``lock`` (the GPU host's step owns it: an
    earlier run's entries, of processes whose ids came back, must not hold memory)."""
    with _book(lock + ".budget") as book:
        book["held"].clear()
        book["waiting"].clear()


def _alive(key: str) -> bool:
    try:
        os.kill(int(key.split(":")[0]), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
