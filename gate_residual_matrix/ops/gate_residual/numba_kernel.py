"""``numba``: our kernels (numba.cuda on the ``cuda`` target, numba on the CPU for ``cpu``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gate_residual_matrix.contract.base import Implementation


def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """Forward (and backward) through ``GateResidual`` or ``GateResidualCPU`` by device."""
    device = inputs["residual"].device.type
    forward: Callable[..., torch.Tensor]
    Fn: Any  # an autograd Function class
    if device == "cuda":
        from gate_residual_matrix.kernels import gate_residual as gpu

        Fn, forward = gpu.GateResidual, gpu.gate_residual_forward
    else:
        from gate_residual_matrix.kernels import gate_residual_cpu as cpu

        Fn, forward = cpu.GateResidualCPU, cpu.gate_residual_cpu
    args = (inputs["residual"], inputs["gate"], inputs["y"], inputs["index"])
    if not backward:
        return {"out": forward(*args)}
    residual, gate, y = (t.detach().requires_grad_() for t in args[:3])
    out = Fn.apply(residual, gate, y, inputs["index"])
    out.backward(inputs["grad_out"])
    return {"out": out.detach(), "res": residual.grad, "y": y.grad, "gate": gate.grad}


NUMBA = Implementation(
    name="numba",
    source=("gate_residual numba.cuda kernels (kernels/gate_residual.py); "
            "CPU: kernels/gate_residual_cpu.py"),
    has_backward=True,
    run=run,
    cached_kernels=("cuda",),  # kernels/cubin_cache.py: built once per machine
    bitwise_claims=("out", "res", "y"),
)
