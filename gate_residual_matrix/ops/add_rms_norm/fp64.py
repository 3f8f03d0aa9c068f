"""``fp64``: ``h = x + residual`` and its RMSNorm in float64 on the cell's device, gradients
written out as :mod:`ops.rms_norm.fp64` (no atomics). An accuracy reference only."""

from __future__ import annotations

import torch

from gate_residual_matrix.contract.base import Implementation
from gate_residual_matrix.ops.rms_norm.fp64 import grad_through_norm, normalize64


def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """out, h (and grad_x, grad_residual, grad_weight) in float64 on the inputs' device."""
    with torch.no_grad():
        h = inputs["x"].double() + inputs["residual"].double()
        n, r = normalize64(h)
        weight = inputs["weight"].double()
        out = n * weight
        if not backward:
            return {"out": out, "h": h}
        g = inputs["grad_out"].double()
        grad_h = inputs["grad_h"].double() + grad_through_norm(g * weight, n, r)
    return {"out": out, "h": h, "x": grad_h, "residual": grad_h.clone(),
            "weight": (g * n).sum(0)}


FP64 = Implementation(
    name="fp64",
    source="float64 h = x + residual and RMSNorm(h) on the cell's device, gradients written "
           "out (torch.sum, no atomics)",
    has_backward=True,
    run=run,
    role="accuracy_reference",
)
