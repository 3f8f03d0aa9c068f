"""``fp64``: the norm and the modulation in float64 on the cell's device, gradients written
out (no atomics: ``grad_scale[k]`` and ``grad_shift[k]`` are ``torch.sum`` over the rows with
``index == k``, as :mod:`ops.indexed_scale_shift.fp64` on a GPU). An accuracy reference."""

from __future__ import annotations

import torch

from gate_residual_matrix.contract.base import Implementation
from gate_residual_matrix.ops.rms_norm.fp64 import grad_through_norm, normalize64


def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """out (and grad_x, grad_weight, grad_scale, grad_shift) in float64."""
    index = inputs["index"]
    with torch.no_grad():
        n, r = normalize64(inputs["x"])
        weight, scale = inputs["weight"].double(), inputs["scale"].double()
        y = n * weight
        t = 1 + scale.index_select(0, index)
        out = y * t + inputs["shift"].double().index_select(0, index)
        if not backward:
            return {"out": out}
        g = inputs["grad_out"].double()
        gy = g * t
        del t
        rows = [index == k for k in range(scale.shape[0])]
        grad_scale = torch.stack([(g[m] * y[m]).sum(0) for m in rows])
        grad_shift = torch.stack([g[m].sum(0) for m in rows])
        del y
        grad_weight = (gy * n).sum(0)
        grad_x = grad_through_norm(gy * weight, n, r)
    return {"out": out, "x": grad_x, "weight": grad_weight, "scale": grad_scale,
            "shift": grad_shift}


FP64 = Implementation(
    name="fp64",
    source="float64 RMSNorm and modulation on the cell's device, gradients written out "
           "(per-row-group torch.sum, no atomics)",
    has_backward=True,
    run=run,
    role="accuracy_reference",
)
