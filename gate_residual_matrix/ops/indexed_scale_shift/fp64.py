"""``fp64``: the eager expression in float64 on the cell's device. An accuracy reference only.

As gate_residual's: on the CPU autograd's backward (``index_add_`` in float64, serial, in row
order); on a GPU the gradients are written out so that no atomics change their last bits:
``grad_x = grad_out * (1 + scale[index])``, ``grad_scale[k]`` and ``grad_shift[k]`` a
``torch.sum`` over the rows with ``index == k`` of ``grad_out * x`` and of ``grad_out``.
"""

from __future__ import annotations

import torch

from gate_residual_matrix.contract.base import Implementation


def _cpu(x: dict, backward: bool) -> dict[str, torch.Tensor]:
    xs, scale, shift = (x[k].double().requires_grad_(backward) for k in ("x", "scale", "shift"))
    with torch.set_grad_enabled(backward):
        out = xs * (1 + scale.index_select(0, x["index"])) + shift.index_select(0, x["index"])
    if not backward:
        return {"out": out}
    out.backward(x["grad_out"].double())
    return {"out": out.detach(), "x": xs.grad, "scale": scale.grad, "shift": shift.grad}


def _gpu(x: dict, backward: bool) -> dict[str, torch.Tensor]:
    index = x["index"]
    scale, shift, xs = x["scale"].double(), x["shift"].double(), x["x"].double()
    t = 1 + scale.index_select(0, index)
    out = xs * t + shift.index_select(0, index)
    if not backward:
        return {"out": out}
    grad_out = x["grad_out"].double()
    grad_x = grad_out * t
    del t
    product = grad_out * xs
    rows = [index == k for k in range(scale.shape[0])]
    grad_scale = torch.stack([product[r].sum(dim=0) for r in rows])
    grad_shift = torch.stack([grad_out[r].sum(dim=0) for r in rows])
    return {"out": out, "x": grad_x, "scale": grad_scale, "shift": grad_shift}


def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """The eager expression in float64 on the inputs' device, with its gradients for
    ``grad_out`` (see the module docstring for how each device computes them)."""
    x = {k: v.detach() for k, v in inputs.items()}
    cuda = x["x"].is_cuda
    with torch.no_grad() if cuda else torch.enable_grad():
        return _gpu(x, backward) if cuda else _cpu(x, backward)


FP64 = Implementation(
    name="fp64",
    source="float64 eager expression on the cell's device (GPU: grad_scale and grad_shift "
           "as per-row sums, repeatable)",
    has_backward=True,
    run=run,
    role="accuracy_reference",
)
