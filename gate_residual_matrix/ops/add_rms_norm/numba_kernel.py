"""``numba``: our add + RMSNorm kernels (numba.cuda on ``cuda``, numba on the CPU for
``cpu``): ``h = round(x + residual)``, then RMSNorm in vLLM's batch-invariant order."""

from __future__ import annotations

from typing import Any

import torch

from gate_residual_matrix.contract.base import Implementation


def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """Forward (and backward) through ``AddRMSNorm`` or ``AddRMSNormCPU``: ``out`` and ``h``;
    with ``backward``, ``x``, ``residual`` (the same values) and ``weight`` for upstreams
    ``grad_out`` (into out) and ``grad_h`` (into h)."""
    Fn: Any  # an autograd Function class
    if inputs["x"].device.type == "cuda":
        from gate_residual_matrix.kernels import rms_norm as gpu

        Fn, forward = gpu.AddRMSNorm, gpu.add_rms_norm_forward
    else:
        from gate_residual_matrix.kernels import rms_norm_cpu as cpu

        Fn, forward = cpu.AddRMSNormCPU, cpu.add_rms_norm_cpu
    if not backward:
        out, h = forward(inputs["x"], inputs["residual"], inputs["weight"])
        return {"out": out, "h": h}
    x, residual, weight = (inputs[k].detach().requires_grad_()
                           for k in ("x", "residual", "weight"))
    out, h = Fn.apply(x, residual, weight)
    torch.autograd.backward((out, h), (inputs["grad_out"], inputs["grad_h"]))
    return {"out": out.detach(), "h": h.detach(), "x": x.grad, "residual": residual.grad,
            "weight": weight.grad}


NUMBA = Implementation(
    name="numba",
    source=("add + RMSNorm numba.cuda kernels (kernels/rms_norm.py; RMSNorm in vLLM's "
            "batch-invariant order on h = round(x + residual)); CPU: kernels/rms_norm_cpu.py"),
    has_backward=True,
    run=run,
    cached_kernels=("cuda",),  # kernels/cubin_cache.py: built once per machine
    bitwise_claims=(),
)
