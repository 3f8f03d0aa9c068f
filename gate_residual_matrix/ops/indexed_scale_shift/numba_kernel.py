"""``numba``: our kernels (numba.cuda on the ``cuda`` target, numba on the CPU for ``cpu``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gate_residual_matrix.contract.base import Implementation


def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """Forward (and backward) through ``IndexedScaleShift`` or ``IndexedScaleShiftCPU``."""
    forward: Callable[..., torch.Tensor]
    Fn: Any  # an autograd Function class
    if inputs["x"].device.type == "cuda":
        from gate_residual_matrix.kernels import indexed_scale_shift as gpu

        Fn, forward = gpu.IndexedScaleShift, gpu.indexed_scale_shift_forward
    else:
        from gate_residual_matrix.kernels import indexed_scale_shift_cpu as cpu

        Fn, forward = cpu.IndexedScaleShiftCPU, cpu.indexed_scale_shift_cpu
    args = (inputs["x"], inputs["scale"], inputs["shift"], inputs["index"])
    if not backward:
        return {"out": forward(*args)}
    x, scale, shift = (t.detach().requires_grad_() for t in args[:3])
    out = Fn.apply(x, scale, shift, inputs["index"])
    out.backward(inputs["grad_out"])
    return {"out": out.detach(), "x": x.grad, "scale": scale.grad, "shift": shift.grad}


NUMBA = Implementation(
    name="numba",
    source=("indexed_scale_shift numba.cuda kernels (kernels/indexed_scale_shift.py); "
            "CPU: kernels/indexed_scale_shift_cpu.py"),
    has_backward=True,
    run=run,
    cached_kernels=("cuda",),  # kernels/cubin_cache.py: built once per machine
    bitwise_claims=("out", "x"),
)
