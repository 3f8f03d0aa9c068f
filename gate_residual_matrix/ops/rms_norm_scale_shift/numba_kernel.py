"""``numba``: our RMSNorm + indexed scale/shift kernels (numba.cuda on ``cuda``, numba on the
CPU for ``cpu``): the forward in vllm-omni's order, a batch-invariant backward."""

from __future__ import annotations

from typing import Any

import torch

from gate_residual_matrix.contract.base import Implementation


def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """Forward (and backward) through ``RMSNormScaleShift`` or ``RMSNormScaleShiftCPU``:
    ``out``; with ``backward``, ``x``, ``weight``, ``scale`` and ``shift`` gradients for
    upstream ``grad_out``."""
    Fn: Any  # an autograd Function class
    if inputs["x"].device.type == "cuda":
        from gate_residual_matrix.kernels import rms_norm as gpu

        Fn, forward = gpu.RMSNormScaleShift, gpu.rms_norm_scale_shift_forward
    else:
        from gate_residual_matrix.kernels import rms_norm_cpu as cpu

        Fn, forward = cpu.RMSNormScaleShiftCPU, cpu.rms_norm_scale_shift_cpu
    names = ("x", "weight", "scale", "shift")
    if not backward:
        return {"out": forward(*(inputs[k] for k in names), inputs["index"])}
    leaves = [inputs[k].detach().requires_grad_() for k in names]
    out = Fn.apply(*leaves, inputs["index"])
    out.backward(inputs["grad_out"])
    return {"out": out.detach(), **{k: t.grad for k, t in zip(names, leaves, strict=True)}}


NUMBA = Implementation(
    name="numba",
    source=("RMSNorm + indexed scale/shift numba.cuda kernels (kernels/rms_norm.py; forward in "
            "vllm-omni's order); CPU: kernels/rms_norm_cpu.py"),
    has_backward=True,
    run=run,
    cached_kernels=("cuda",),  # kernels/cubin_cache.py: built once per machine
    bitwise_claims=(),
)
