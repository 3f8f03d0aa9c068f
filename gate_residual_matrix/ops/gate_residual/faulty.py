"""``fault``: a test-only implementation that fails on purpose, to prove the failure paths.

Registered only when ``GATE_RESIDUAL_FAULTS=1`` (see :mod:`ops.gate_residual.implementations`), so a
user never meets it. What it does is chosen per cell by ``GATE_RESIDUAL_FAULT`` in the
cell's environment (a mode's ``env`` sets it), read at each call:

- unset or ``none``: computes what ``eager`` computes (cell ``ok``);
- ``raise``: raises :class:`InjectedFault` (``error``);
- ``hang``: prints a marker line and sleeps forever (``timeout``);
- ``oom``: allocates 64 MiB blocks without bound until the allocator fails (``oom``),
  bounded for safety: see :func:`allocate_without_bound`;
- ``kill``: prints a marker line and sends SIGKILL to its own process (``error``; the
  reason says that SIGKILL is ambiguous and what /proc/vmstat showed);
- ``GATE_RESIDUAL_FAULT_KILL_ROWS=N`` / ``..._HANG_ROWS=N`` (in the runner's environment,
  with any fault): SIGKILL, or sleep forever, at the first call with N rows;
- ``illegal_address``: on ``cuda``, a numba.cuda kernel stores 4 TiB past an array and the
  CUDA error 700 poisons the context (``error``); on ``cpu`` it raises.

Example (a matrix whose modes arm it, run with ``GATE_RESIDUAL_FAULTS=1``)::

    modes:
      plain: {}
      raise: {env: {GATE_RESIDUAL_FAULT: raise}}
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch

from gate_residual_matrix import settings
from gate_residual_matrix.contract.base import Implementation
from gate_residual_matrix.ops.gate_residual.eager import run as eager_run

ENABLE_VAR = "GATE_RESIDUAL_FAULTS"
FAULT_VAR = "GATE_RESIDUAL_FAULT"
CAP_VAR = "GATE_RESIDUAL_FAULT_OOM_MB"
KILL_ROWS_VAR = "GATE_RESIDUAL_FAULT_KILL_ROWS"
"""Set in the runner's environment (not a mode's: the cell's fingerprint stays the same), the
cell process kills itself when ``fault`` is called with this many rows: a cell stopped in
the middle of its cases, for the resume tests."""
HANG_ROWS_VAR = "GATE_RESIDUAL_FAULT_HANG_ROWS"
"""As :data:`KILL_ROWS_VAR`, but the call sleeps forever (a cell stopped by a signal)."""
FAULTS = settings.FAULTS
DEFAULT_CAP_MB = settings.SETTINGS[CAP_VAR].default
BLOCK_BYTES = 64 << 20


class InjectedFault(RuntimeError):
    """The failure ``GATE_RESIDUAL_FAULT=raise`` asks for."""


def _marker(text: str) -> None:
    """One line on stdout, flushed: the log tail then shows the fault was reached."""
    print(f"[fault] {text}", flush=True)


def _cap_bytes() -> int:
    return settings.get(CAP_VAR) << 20


def _address_space_limit(cap: int):
    """Lower this process's RLIMIT_AS to its current size + ``cap``; return a restorer.

    Returns None where there is no ``resource`` module or ``/proc/self/statm``."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError):
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = size + cap if hard == resource.RLIM_INFINITY else min(hard, size + cap)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def allocate_without_bound(device: str) -> None:
    """Allocate and fill 64 MiB blocks until the allocator refuses; raise what it raised.

    Safety: on the CPU the process's address space is first limited (RLIMIT_AS) to its
    size plus ``GATE_RESIDUAL_FAULT_OOM_MB`` (default 512), so the real allocator fails
    (``RuntimeError: ... can't allocate memory``) long before the machine runs short; where
    no such limit can be set, :class:`MemoryError` is raised at the cap. On CUDA the
    process's share of the GPU is limited to the cap (``set_per_process_memory_fraction``)
    and torch raises ``torch.cuda.OutOfMemoryError``. Limits are restored and the blocks
    freed before the error propagates.
    """
    cap, blocks = _cap_bytes(), []
    if device == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total))
        try:
            while True:
                blocks.append(torch.ones(BLOCK_BYTES, dtype=torch.uint8, device="cuda"))
        finally:
            blocks.clear()
            torch.cuda.set_per_process_memory_fraction(1.0)
            torch.cuda.empty_cache()
    restore = _address_space_limit(cap)  # CPU
    try:
        while True:
            if restore is None and len(blocks) * BLOCK_BYTES >= cap:
                raise MemoryError(f"fault oom: safety cap of {cap >> 20} MiB reached")
            blocks.append(torch.ones(BLOCK_BYTES, dtype=torch.uint8))
    finally:
        blocks.clear()
        if restore is not None:
            restore()


def illegal_address() -> None:
    """Store through an address 4 TiB past a one-element CUDA array, then synchronise."""
    import numpy as np
    from numba import cuda

    @cuda.jit
    def poke(a, i):
        a[i] = 1.0

    target = cuda.device_array(1, dtype=np.float32)
    poke[1, 1](target, 1 << 40)
    cuda.synchronize()
    raise InjectedFault("fault illegal_address: the kernel ran and no CUDA error was raised")


def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """Do what ``GATE_RESIDUAL_FAULT`` says (see the module docstring), else eager."""
    device = inputs["residual"].device.type
    rows = inputs["residual"].shape[0]
    kill_rows, hang_rows = settings.get(KILL_ROWS_VAR), settings.get(HANG_ROWS_VAR)
    if rows == kill_rows:
        _marker(f"{KILL_ROWS_VAR}={kill_rows}: sending SIGKILL to own pid {os.getpid()}")
        os.kill(os.getpid(), signal.SIGKILL)
    if rows == hang_rows:
        _marker(f"{HANG_ROWS_VAR}={hang_rows}: sleeping forever in pid {os.getpid()}")
        while True:
            time.sleep(3600)
    fault = settings.get(FAULT_VAR)
    if fault == "none":
        return eager_run(inputs, backward=backward)
    if fault == "raise":
        raise InjectedFault(f"injected by {FAULT_VAR}=raise")
    if fault == "hang":
        _marker(f"{FAULT_VAR}=hang: sleeping forever in pid {os.getpid()}")
        while True:
            time.sleep(3600)
    if fault == "oom":
        _marker(f"{FAULT_VAR}=oom: allocating without bound on {device}")
        allocate_without_bound(device)
    if fault == "kill":
        _marker(f"{FAULT_VAR}=kill: sending SIGKILL to own pid {os.getpid()}")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "illegal_address":
        if device != "cuda":
            raise InjectedFault(f"{FAULT_VAR}=illegal_address needs the cuda target, "
                                f"got {device}")
        _marker(f"{FAULT_VAR}=illegal_address: storing 4 TiB past a CUDA array")
        illegal_address()
    raise AssertionError(f"{FAULT_VAR}={fault!r} has no branch here")  # settings.FAULTS


FAULT = Implementation(
    name="fault",
    source=("fault injection (ops/gate_residual/faulty.py), armed per cell by "
            f"{FAULT_VAR}: {', '.join(FAULTS)}"),
    has_backward=True,
    run=run,
)


def run_inplace(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """Forward only, written into ``residual`` (as an in-place serving kernel does)."""
    residual = inputs["residual"]
    residual.add_(inputs["gate"].index_select(0, inputs["index"]) * inputs["y"])
    return {"out": residual}


def run_batch_variant(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """Eager, except that ``grad_gate`` sums the rows in the storage dtype (each addition
    rounded) forwards when N is odd and backwards when N is even: a reduction order that
    depends on the batch size."""
    got = eager_run(inputs, backward=backward)
    if not backward:
        return got
    n = inputs["residual"].shape[0]
    order = torch.arange(n) if n % 2 else torch.arange(n - 1, -1, -1)
    order = order.to(inputs["index"].device)
    contrib = inputs["grad_out"] * inputs["y"]
    gate = torch.zeros_like(inputs["gate"])
    for row in order.tolist():  # one rounded addition at a time, in this order
        gate[inputs["index"][row]] += contrib[row]
    return {**got, "gate": gate}


INPLACE = Implementation(
    name="inplace",
    source="test-only: writes its result into residual (ops/gate_residual/faulty.py)",
    has_backward=False,
    run=run_inplace,
)

BATCH_VARIANT = Implementation(
    name="batch_variant",
    source="test-only: grad_gate summed in an order that depends on N "
           "(ops/gate_residual/faulty.py)",
    has_backward=True,
    run=run_batch_variant,
)

#: Test-only implementations registered beside ``fault`` when GATE_RESIDUAL_FAULTS=1.
TEST_ONLY = (INPLACE, BATCH_VARIANT)
