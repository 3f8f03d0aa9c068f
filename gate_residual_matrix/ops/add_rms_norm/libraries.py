"""add_rms_norm's library rows: Liger-Kernel on the trainer side, vLLM's CUDA op on the rollout
side (:mod:`contract.library`; per version: :mod:`contract.versioned`).

Read in the wheels of liger-kernel 0.8.4 and 0.8.5 and vllm 0.30.0 and 0.33.0:

- Liger-Kernel ``liger_kernel.ops.fused_add_rms_norm:LigerFusedAddRMSNormFunction.apply(X,
  R, W, eps, offset, casting_mode, in_place) -> (Y, S)`` (Triton, forward and backward):
  ``S = X + R`` in X's dtype, ``Y = RMSNorm(S) * W`` by ``casting_mode`` as
  ``LigerRMSNormFunction``; one row per mode (``"llama"``, ``"gemma"``, ``"none"``),
  ``offset = 0.0``, ``in_place = False`` (this Function's default). Its backward takes the
  upstreams of Y and S and returns dX for both X and R (``dR is equal to dX``).
- vLLM ``torch.ops._C.fused_add_rms_norm(input, residual, weight, epsilon)`` of
  ``vllm/_C_stable_libtorch.abi3.so`` (schema ``fused_add_rms_norm(Tensor! input, Tensor!
  residual, Tensor? weight, float epsilon) -> ()``): in place, ``residual <- input +
  residual`` and ``input <- RMSNorm(residual) * weight``. Called on our copies of ``x`` and
  ``residual`` (the inputs stay untouched): ``out`` is the input copy, ``h`` the residual
  copy. Forward only.
"""

from __future__ import annotations

import torch

from gate_residual_matrix.contract.extension import ExtensionImplementation
from gate_residual_matrix.contract.library import LibraryImplementation
from gate_residual_matrix.ops.rms_norm import EPS

LIGER = "liger_kernel.ops.fused_add_rms_norm"
CASTING_MODES = ("llama", "gemma", "none")
VLLM_EXTENSION = "vllm/_C_stable_libtorch.abi3.so"
LIGER_READ = "liger-kernel 0.8.4 and 0.8.5"
VLLM_READ = "vllm 0.30.0 and 0.33.0"


def _liger_run(mode: str):
    name = f"liger_fused_add_rms_norm_{mode}"

    def run(inputs, *, backward: bool, impl=None) -> dict[str, torch.Tensor]:
        """``LigerFusedAddRMSNormFunction.apply(x, residual, weight, eps, 0.0, mode, False)``
        -> ``out``, ``h``; with ``backward``, grads of x, residual and weight for the upstreams
        ``grad_out`` (of out) and ``grad_h`` (of h)."""
        impl = impl or _BY_NAME[name]
        x, residual, weight = (inputs[k].detach().requires_grad_(backward)
                               for k in ("x", "residual", "weight"))
        with torch.enable_grad() if backward else torch.no_grad():
            out, h = impl.call(x, residual, weight, EPS, 0.0, mode, False)
        if not backward:
            return {"out": out, "h": h}
        grads = torch.autograd.grad((out, h), (x, residual, weight),
                                    (inputs["grad_out"], inputs["grad_h"]))
        return {"out": out.detach(), "h": h.detach(), "x": grads[0], "residual": grads[1],
                "weight": grads[2]}

    run.__qualname__ = f"run_{name}"
    return run


def _liger_row(mode: str) -> LibraryImplementation:
    return LibraryImplementation(
        name=f"liger_fused_add_rms_norm_{mode}",
        source=(f"Liger-Kernel {LIGER}:LigerFusedAddRMSNormFunction, casting_mode={mode!r}, "
                f"offset=0.0, in_place=False (Triton; read in {LIGER_READ})"),
        has_backward=True,
        run=_liger_run(mode),
        targets=("cuda",),
        distribution="liger-kernel",
        entries=(f"{LIGER}:LigerFusedAddRMSNormFunction.apply",),
        backend=lambda module: ("Triton _fused_add_rms_norm_forward_kernel / "
                                "_fused_add_rms_norm_backward_kernel"),
        notes=("Triton only: no CPU path, cuda only",
               "grad_residual is Liger's dX (its backward returns dX for both)"),
    )


def run_cuda(inputs, *, backward: bool, impl=None) -> dict[str, torch.Tensor]:
    """``torch.ops._C.fused_add_rms_norm(x', residual', weight, eps)`` on copies ``x'``,
    ``residual'``: ``out`` = x', ``h`` = residual'; forward only."""
    impl = impl or VLLM_FUSED_ADD_RMS_NORM_CUDA
    out, h = inputs["x"].clone(), inputs["residual"].clone()
    impl.call(out, h, inputs["weight"], EPS)
    return {"out": out, "h": h}


LIGER_ROWS = tuple(_liger_row(mode) for mode in CASTING_MODES)

VLLM_FUSED_ADD_RMS_NORM_CUDA = ExtensionImplementation(
    name="vllm_fused_add_rms_norm_cuda",
    source=(f"vLLM torch.ops._C.fused_add_rms_norm of {VLLM_EXTENSION} (CUDA, torch stable "
            f"ABI, in place into copies of x and residual; read in {VLLM_READ})"),
    has_backward=False,
    run=run_cuda,
    targets=("cuda",),
    distribution="vllm",
    library=VLLM_EXTENSION,
    op="_C::fused_add_rms_norm",
    entries=(f"torch.ops._C:fused_add_rms_norm ({VLLM_EXTENSION})",),
    notes=("in place into copies of x (-> out) and residual (-> h): the inputs stay untouched",
           "the extension may run under another torch than its wheel pins: the report's "
           "environment records both"),
)

LIBRARIES = (*LIGER_ROWS, VLLM_FUSED_ADD_RMS_NORM_CUDA)
_BY_NAME = {row.name: row for row in LIBRARIES}
