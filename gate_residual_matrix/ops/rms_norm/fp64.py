"""``fp64``: RMSNorm in float64 on the cell's device, with its gradients written out. An
accuracy reference only.

With ``r = rsqrt(mean(x^2) + eps)``, ``n = x * r``: ``out = n * weight``;
``grad_weight = sum_rows(grad_out * n)``; ``grad_x = r * (gn - n * mean(gn * n))`` with
``gn = grad_out * weight`` (the chain rule through the mean of squares). Every reduction is
a ``torch.sum``/``mean`` (no atomics), so the reference repeats its bits. The functions here
are shared with ``add_rms_norm`` and ``rms_norm_scale_shift``.
"""

from __future__ import annotations

import torch

from gate_residual_matrix.contract.base import Implementation
from gate_residual_matrix.ops.rms_norm import EPS


def normalize64(x: torch.Tensor, eps: float = EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """``(n, r)``: ``x`` (N, D) in float64 normalized, and ``r`` (N, 1) = rsqrt(mean + eps)."""
    x = x.double()
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * r, r


def grad_through_norm(gn: torch.Tensor, n: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """d(loss)/dx from d(loss)/dn = ``gn`` (N, D) for ``n = x * rsqrt(mean(x^2) + eps)``,
    float64: ``r * (gn - n * mean(gn * n, -1))``."""
    return r * (gn - n * (gn * n).mean(-1, keepdim=True))


def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """out (and grad_x, grad_weight for ``grad_out``) in float64 on the inputs' device."""
    with torch.no_grad():
        n, r = normalize64(inputs["x"])
        weight = inputs["weight"].double()
        out = n * weight
        if not backward:
            return {"out": out}
        g = inputs["grad_out"].double()
        grad_weight = (g * n).sum(0)
        grad_x = grad_through_norm(g * weight, n, r)
    return {"out": out, "x": grad_x, "weight": grad_weight}


FP64 = Implementation(
    name="fp64",
    source="float64 RMSNorm on the cell's device, gradients written out (torch.sum, no "
           "atomics)",
    has_backward=True,
    run=run,
    role="accuracy_reference",
)
