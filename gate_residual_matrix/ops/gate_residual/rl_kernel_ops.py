"""RL-Kernel's H3 gate residual op (CUDA, forward and backward), when installed.

RL-Kernel (github.com/RL-Align/RL-Kernel) is not on PyPI (``pip download rl-kernel``,
``rl_kernel``, ``rlkernel``: no distribution). Its distribution is ``RL-Kernel`` and its
package ``rl_engine`` (pyproject.toml); read in the repository at commit a26b41a3:

``rl_engine.kernels.ops.cuda.h3.gate_residual.H3GateResidualCudaOp()(residual, y, gate,
index) -> Tensor``: ``residual + gate[index] * y`` by the compiled extension
``rl_engine._C.h3_gate_residual_forward`` (``KERNEL_ID``), differentiable through a
``torch.autograd.Function`` whose backward is ``BACKWARD_KERNEL_ID`` (a stable argsort, then
``rl_engine._C.h3_gate_residual_backward``: a deterministic float32 segment sum for
``grad_gate``). The module's ``h3_gate_residual_available()`` says whether the extension has
those entry points. ``index`` must be int64 (``validate_h3_gate_residual``): an int32 index is
converted by us, which changes no value. This is the CUDA op of the reference report
(``reports/reference/gate_residual_b200.json``: "rl-kernel H3GateResidualCudaOp").
"""

from __future__ import annotations

import sys
from types import ModuleType

import torch

from gate_residual_matrix.contract.library import LibraryImplementation

MODULE = "rl_engine.kernels.ops.cuda.h3.gate_residual"
TREE_MODULES = (MODULE, "rl_engine.backends.cuda.model_specific.minimax_h3.gate_residual")
"""The module paths RL-Kernel has used for the op, newest layout last (both supported on a
source tree: contract.versioned.on_tree)."""


def run(inputs, *, backward: bool, impl=None) -> dict[str, torch.Tensor]:
    """``H3GateResidualCudaOp()(residual, y, gate, index)``, with autograd grads. ``impl``:
    the calling row (one bound to a source tree), default :data:`RL_KERNEL_H3`."""
    _, op_class = (impl or RL_KERNEL_H3).entry()
    op = op_class()
    index = inputs["index"].to(torch.int64)
    if not backward:
        with torch.no_grad():
            return {"out": op(inputs["residual"], inputs["y"], inputs["gate"], index)}
    residual = inputs["residual"].detach().requires_grad_()
    gate = inputs["gate"].detach().requires_grad_()
    y = inputs["y"].detach().requires_grad_()
    out = op(residual, y, gate, index)
    out.backward(inputs["grad_out"])
    return {"out": out.detach(), "res": residual.grad, "y": y.grad, "gate": gate.grad}


def kernels(module: ModuleType) -> str:
    """The kernel ids the module declares for its forward and backward."""
    forward = getattr(module, "KERNEL_ID", "forward kernel id not declared")
    backward = getattr(module, "BACKWARD_KERNEL_ID", "backward kernel id not declared")
    return f"{forward}; backward {backward}"


def extension_missing(module: ModuleType) -> str | None:
    """Why the op cannot run although its module imports: the extension lacks its kernels."""
    available = getattr(module, "h3_gate_residual_available", None)
    if available is None:
        return f"{MODULE} has no h3_gate_residual_available()"
    if not available():
        base = sys.modules.get("rl_engine.kernels.ops.base")
        why = getattr(base, "_EXT_ERROR", None)
        first = (str(why).strip().splitlines() or [""])[0] if why else ""
        return (f"{module.__name__}.h3_gate_residual_available() is False: rl_engine._C lacks "
                "h3_gate_residual_forward/backward (the CUDA extension is not built)"
                + (f": {first}" if first else ""))
    return None


RL_KERNEL_H3 = LibraryImplementation(
    name="rl_kernel_h3",
    source=(f"RL-Kernel {MODULE}:H3GateResidualCudaOp (CUDA extension rl_engine._C; path "
            "read at RL-Align/RL-Kernel a26b41a3; not on PyPI)"),
    has_backward=True,
    run=run,
    targets=("cuda",),
    distribution="RL-Kernel",
    entries=(f"{MODULE}:H3GateResidualCudaOp",),
    tree_entries=tuple(f"{m}:H3GateResidualCudaOp" for m in TREE_MODULES),
    backend=kernels,
    check=extension_missing,
    notes=("an int32 index is converted to int64 by us (the op takes int64 only)",),
)
