"""``numba``: our RMSNorm kernels (numba.cuda on the ``cuda`` target, numba on the CPU for
``cpu``): the forward in vLLM's batch-invariant order, a batch-invariant backward."""

from __future__ import annotations

from typing import Any

import torch

from gate_residual_matrix.contract.base import Implementation


def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """Forward (and backward) through ``RMSNorm`` or ``RMSNormCPU``: ``out``; with
    ``backward``, ``x`` (grad_x) and ``weight`` (grad_weight) for upstream ``grad_out``."""
    Fn: Any  # an autograd Function class
    if inputs["x"].device.type == "cuda":
        from gate_residual_matrix.kernels import rms_norm as gpu

        Fn, forward = gpu.RMSNorm, gpu.rms_norm_forward
    else:
        from gate_residual_matrix.kernels import rms_norm_cpu as cpu

        Fn, forward = cpu.RMSNormCPU, cpu.rms_norm_cpu
    if not backward:
        return {"out": forward(inputs["x"], inputs["weight"])}
    x, weight = (inputs[k].detach().requires_grad_() for k in ("x", "weight"))
    out = Fn.apply(x, weight)
    out.backward(inputs["grad_out"])
    return {"out": out.detach(), "x": x.grad, "weight": weight.grad}


NUMBA = Implementation(
    name="numba",
    source=("RMSNorm numba.cuda kernels (kernels/rms_norm.py; forward in vLLM's batch-invariant "
            "order); CPU: kernels/rms_norm_cpu.py"),
    has_backward=True,
    run=run,
    cached_kernels=("cuda",),  # kernels/cubin_cache.py: built once per machine
    bitwise_claims=(),
)
