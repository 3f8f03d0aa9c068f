"""A cell's timing loops: each implementation's median forward (and forward+backward) time on
a case's inputs (:func:`timings`), taken with the GPU to the cell alone (:func:`take`).

Where several processes share the GPU (``GATE_RESIDUAL_GPU_LOCK``, :mod:`contract.gpu_lock`),
a cell process keeps each case's host inputs (:class:`Pending`) and takes every case's
timings in one exclusive pass after its last case: the GPU changes hands once per cell
process instead of once per case, and each hand-over stops every other process's GPU work
until the stretches in flight have drained. The inputs go back to the device for that pass
(the case's own device copies are freed with the case, so the case's peak memory is
unchanged). Alone on a GPU, or on the CPU, each case is timed at its end, as before.

Example (a CPU cell times at once)::

    take([Pending(impls, x, on_device, "257")], results=report["results"], device="cpu",
         matrix=matrix, inference=False, clock=clock, on_error=record)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gate_residual_matrix.contract import gpu_lock, timing
from gate_residual_matrix.contract.base import Implementation


@dataclass
class Pending:
    """One case's timing loops still to take: the implementations that ran on it (in run
    order), its inputs ``x`` (:class:`contract.inputs.CaseInputs`, on the host), their copies
    on the cell's device (None once the case has freed them) and the case's key."""

    impls: list
    x: object
    on_device: dict | None
    key: str


def inputs_for(impl: Implementation, x, on_device: dict) -> dict:
    """The case's inputs on ``impl``'s device (the cell's unless it names its own)."""
    return on_device if impl.device is None else {
        k: v.to(impl.device) for k, v in x.tensors.items()}


def timings(impl: Implementation, inputs: dict, device: str, matrix,
            inference: bool = False) -> dict:
    """Median forward (and forward+backward) times. On the CPU: no warm-up call (the
    repeats before it have compiled and warmed everything; at N = 32768 each call costs
    seconds) and 1.5 s of timed calls (at least one); on a GPU: ``timing.warmup`` calls,
    then up to ``timing.iters`` calls or 10 s. An implementation that compiles per shape is
    timed through ``run``, its static graph of the case's size (``"graph": "static"``).
    ``inference``: the forward only, under ``torch.inference_mode()`` as the cell's runs (the
    graph its runs compiled). Raises what the implementation raises."""
    budget = 10.0 if device == "cuda" else 1.5
    warmup = matrix.timing.warmup if device == "cuda" else 0
    kw = {"device": device, "warmup": warmup, "iters": matrix.timing.iters,
          "max_seconds": budget}
    inputs = {k: v.clone() for k, v in inputs.items()}  # a writer spoils only these
    with torch.inference_mode() if inference else contextlib.nullcontext():
        fwd = timing.median_ms(lambda _i: impl.run(inputs, backward=False), **kw)
    out = {"forward_ms": fwd["median_ms"], "forward_iters": fwd["iters"],
           **({"graph": "static"} if impl.compiles_per_shape else {})}
    if impl.has_backward and not inference:
        both = timing.median_ms(lambda _i: impl.run(inputs, backward=True), **kw)
        out.update(forward_backward_ms=both["median_ms"], forward_backward_iters=both["iters"])
    return out


def take(cases: list[Pending], *, results: dict, device: str, matrix, inference: bool,
         clock, on_error: Callable[[dict, str, BaseException], None]) -> None:
    """Every implementation's timing loops on each of ``cases``, back to back, in one
    section with the GPU to this process alone (:func:`contract.gpu_lock.exclusive`),
    written into ``results[impl]["timings"][key]``. A case whose device copies were freed
    gets them again first (under the shared lock). Where other processes share the GPU,
    each implementation's first forward call on each case is made before the GPU is taken
    (:func:`_first_forward`). ``on_error(entry, key, err)`` records an implementation that
    fails; the others go on. Counted in ``clock``'s ``timings``."""
    if not cases:
        return
    with clock("timings"):
        try:
            _take(cases, results=results, device=device, matrix=matrix, inference=inference,
                  on_error=on_error)
        finally:  # the device copies go before the caller gives its memory share back
            for case in cases:
                case.on_device = None
            if device == "cuda":
                torch.cuda.empty_cache()


def _take(cases: list[Pending], *, results: dict, device: str, matrix, inference: bool,
          on_error) -> None:
    ready = []
    for case in cases:
        if case.on_device is None:
            with gpu_lock.shared():
                case.on_device = {k: v.to(device) for k, v in case.x.tensors.items()}
        impls = [impl for impl in case.impls
                 if _first_forward(impl, case, results, inference, on_error)]
        if impls:
            ready.append((case, impls))
    if not ready:
        return
    with gpu_lock.exclusive():
        for case, impls in ready:
            for impl in impls:
                entry = results[impl.name]
                try:
                    entry["timings"][case.key] = timings(
                        impl, inputs_for(impl, case.x, case.on_device), device, matrix,
                        inference)
                except Exception as err:  # as a failing run: the others go on
                    on_error(entry, case.key, err)


def _first_forward(impl: Implementation, case: Pending, results: dict, inference: bool,
                   on_error) -> bool:
    """One untimed forward call of ``impl`` as its timing loop makes them, before the GPU is
    taken for the timings, where other processes share the GPU (``GATE_RESIDUAL_GPU_LOCK``):
    what a first call of that kind costs (a ``torch.compile`` row's forward graph without
    autograd, loaded or compiled; a library's kernel for a call without gradients, compiled)
    is then paid under the shared lock, which the other cells' GPU work does not wait for,
    not under the exclusive one, which it does. Nothing where no other process shares the
    GPU (a CPU cell: a call there can cost seconds). False (recorded through ``on_error``)
    when the call fails."""
    if gpu_lock.path() is None:
        return True
    try:
        with gpu_lock.shared(), torch.inference_mode() if inference \
                else contextlib.nullcontext():
            clones = {k: v.clone()
                      for k, v in inputs_for(impl, case.x, case.on_device).items()}
            impl.run(clones, backward=False)
    except Exception as err:  # as a failing run: the others go on
        on_error(results[impl.name], case.key, err)
        return False
    return True
