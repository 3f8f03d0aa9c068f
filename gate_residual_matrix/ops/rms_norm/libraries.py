"""rms_norm's library rows: Liger-Kernel on the trainer side, vLLM on the rollout side. Each
calls the library's own function by its exact path (:mod:`contract.library`;
per version, kernel-only from the wheelhouse: :mod:`contract.versioned`).

Read in the wheels of liger-kernel 0.8.4 and 0.8.5 and vllm 0.30.0 and 0.33.0:

- Liger-Kernel ``liger_kernel.ops.rms_norm:LigerRMSNormFunction.apply(X, W, eps, offset,
  casting_mode, in_place, row_mode)`` (Triton, forward and backward). One row per casting
  mode: ``"llama"`` (only the inverse RMS in float32, the normalized row rounded to X's
  dtype before ``* W``), ``"gemma"`` (everything in float32, one rounding at the end),
  ``"none"`` (the whole computation in X's dtype). ``offset = 0.0`` (our op multiplies by
  ``weight``), ``in_place = True`` (Liger's default: dX overwrites the upstream gradient,
  here a copy of ``grad_out``). For D > 256 (BLOCK_SIZE > 256) it runs the one-row-per-program
  kernels ``_rms_norm_forward_kernel`` / ``_rms_norm_backward_kernel``; ``grad_weight`` is
  per-SM float32 partial sums added by ``torch.sum`` and rounded to W's dtype.
- vLLM ``vllm.model_executor.determinism.batch_invariant:rms_norm_batch_invariant(input,
  weight, eps)`` (Triton ``_rms_norm_kernel``: one program per row, a float32 sum of squares
  in blocks of 1024 columns, ``x * (1 / sqrt(mean + eps)) * weight`` in float32, one
  rounding). Forward only. Kernel-only, it loads with stand-ins for the vllm modules it
  imports but this call never reaches (contract.kernel_only.STAND_INS).
- vLLM's CUDA op ``torch.ops._C.rms_norm(out, input, weight, epsilon)`` of
  ``vllm/_C_stable_libtorch.abi3.so`` (schema ``rms_norm(Tensor! result, Tensor input,
  Tensor? weight, float epsilon) -> ()``, read from the file and ``vllm/_custom_ops.py``),
  loaded from the file (:mod:`contract.extension`). Forward only.
"""

from __future__ import annotations

import torch

from gate_residual_matrix.contract.extension import ExtensionImplementation
from gate_residual_matrix.contract.library import LibraryImplementation
from gate_residual_matrix.ops.rms_norm import EPS

LIGER = "liger_kernel.ops.rms_norm"
CASTING_MODES = ("llama", "gemma", "none")
VLLM_BATCH_INVARIANT = "vllm.model_executor.determinism.batch_invariant"
VLLM_EXTENSION = "vllm/_C_stable_libtorch.abi3.so"
LIGER_READ = "liger-kernel 0.8.4 and 0.8.5"
VLLM_READ = "vllm 0.30.0 and 0.33.0"


def _liger_run(mode: str):
    name = f"liger_rms_norm_{mode}"

    def run(inputs, *, backward: bool, impl=None) -> dict[str, torch.Tensor]:
        """``LigerRMSNormFunction.apply(x, weight, eps, 0.0, mode, True)``; with
        ``backward``, autograd's grads of x and weight for a copy of ``grad_out``."""
        impl = impl or _BY_NAME[name]
        x, weight = (inputs[k].detach().requires_grad_(backward) for k in ("x", "weight"))
        with torch.enable_grad() if backward else torch.no_grad():
            out = impl.call(x, weight, EPS, 0.0, mode, True)
        if not backward:
            return {"out": out}
        # in_place=True writes dX into the upstream gradient: give it a copy, not the input
        grad_x, grad_weight = torch.autograd.grad(out, (x, weight), inputs["grad_out"].clone())
        return {"out": out.detach(), "x": grad_x, "weight": grad_weight}

    run.__qualname__ = f"run_{name}"
    return run


def _liger_row(mode: str) -> LibraryImplementation:
    return LibraryImplementation(
        name=f"liger_rms_norm_{mode}",
        source=(f"Liger-Kernel {LIGER}:LigerRMSNormFunction, casting_mode={mode!r}, "
                f"offset=0.0, in_place=True (Triton; read in {LIGER_READ})"),
        has_backward=True,
        run=_liger_run(mode),
        targets=("cuda",),
        distribution="liger-kernel",
        entries=(f"{LIGER}:LigerRMSNormFunction.apply",),
        backend=lambda module: ("Triton _rms_norm_forward_kernel / _rms_norm_backward_kernel "
                                "(one row per program: BLOCK_SIZE > 256)"),
        notes=("Triton only: no CPU path, cuda only",
               "in_place=True (Liger's default) overwrites a copy of grad_out with grad_x"),
    )


def run_batch_invariant(inputs, *, backward: bool, impl=None) -> dict[str, torch.Tensor]:
    """``rms_norm_batch_invariant(x, weight, eps)``; forward only."""
    impl = impl or VLLM_RMS_NORM_BATCH_INVARIANT
    return {"out": impl.call(inputs["x"], inputs["weight"], EPS)}


def run_cuda(inputs, *, backward: bool, impl=None) -> dict[str, torch.Tensor]:
    """``torch.ops._C.rms_norm(out, x, weight, eps)`` into a new ``out``; forward only."""
    impl = impl or VLLM_RMS_NORM_CUDA
    x = inputs["x"]
    out = torch.empty_like(x)
    impl.call(out, x, inputs["weight"], EPS)
    return {"out": out}


LIGER_ROWS = tuple(_liger_row(mode) for mode in CASTING_MODES)

VLLM_RMS_NORM_BATCH_INVARIANT = LibraryImplementation(
    name="vllm_rms_norm_batch_invariant",
    source=(f"vLLM {VLLM_BATCH_INVARIANT}:rms_norm_batch_invariant (Triton; read in "
            f"{VLLM_READ})"),
    has_backward=False,
    run=run_batch_invariant,
    targets=("cuda",),
    distribution="vllm",
    entries=(f"{VLLM_BATCH_INVARIANT}:rms_norm_batch_invariant",),
    backend=lambda module: "Triton _rms_norm_kernel (one row per program, BLOCK_SIZE 1024)",
    notes=("kernel-only: vllm.envs, vllm.platforms, vllm.utils.* are stand-ins that raise if "
           "used; vllm.triton_utils is triton itself",),
)

VLLM_RMS_NORM_CUDA = ExtensionImplementation(
    name="vllm_rms_norm_cuda",
    source=(f"vLLM torch.ops._C.rms_norm of {VLLM_EXTENSION} (CUDA, torch stable ABI; read "
            f"in {VLLM_READ})"),
    has_backward=False,
    run=run_cuda,
    targets=("cuda",),
    distribution="vllm",
    library=VLLM_EXTENSION,
    op="_C::rms_norm",
    entries=(f"torch.ops._C:rms_norm ({VLLM_EXTENSION})",),
    notes=("the extension may run under another torch than its wheel pins: the report's "
           "environment records both",),
)

LIBRARIES = (*LIGER_ROWS, VLLM_RMS_NORM_BATCH_INVARIANT, VLLM_RMS_NORM_CUDA)
_BY_NAME = {row.name: row for row in LIBRARIES}
