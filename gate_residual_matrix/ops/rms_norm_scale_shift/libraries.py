"""rms_norm_scale_shift's library rows: Liger-Kernel on the trainer side, vllm-omni (MiniMax-H3's
rollout) on the other (:mod:`contract.library`; per version:
:mod:`contract.versioned`).

Read in the wheels of liger-kernel 0.8.4 and 0.8.5 and vllm-omni 0.28.0 and 0.30.0:

- Liger-Kernel ``liger_kernel.ops.modulated_rms_norm:LigerModulatedRMSNormFunction.apply(X,
  W, scale, shift, eps, offset, casting_mode, in_place)`` (Triton, forward and backward):
  ``RMSNorm(X) * W`` by ``casting_mode`` (as ``LigerRMSNormFunction``), then
  ``* (1 + scale) + shift`` in that dtype. Its scale/shift rows broadcast over contiguous
  runs of rows; per token they are (N, D), so we pass the gathered rows
  ``scale.index_select(0, index)``, ``shift.index_select(0, index)`` (torch, with autograd:
  Liger's per-row dScale/dShift, in scale's dtype, are summed into the G rows by
  ``index_select``'s backward, which on CUDA adds with atomics). One row per casting mode,
  ``offset = 0.0``, ``in_place = True`` (Liger's default, into a copy of ``grad_out``).
- vllm-omni ``rms_norm_indexed_scale_shift(x, weight, shift, scale, indices, eps)`` in
  ``vllm_omni.diffusion.layers.indexed_modulation`` (0.30.0) and
  ``vllm_omni.diffusion.attention.ops.minimax_h3_modulation`` (0.28.0): Triton
  ``_rms_norm_indexed_scale_shift_kernel`` on CUDA tensors (float32 throughout, one
  rounding); on CPU tensors, in both versions, its own torch branch (float32 RMSNorm times
  ``weight.float()``, rounded to x's dtype, then the modulation in that dtype): the row runs on
  ``cpu`` too, so a CPU/GPU disagreement of the library itself shows. Forward only.
- vllm-omni ``indexed_gate_rms_norm_scale_shift(residual, gate, branch, weight, shift, scale,
  indices, eps) -> (residual_out, modulated_out)`` (same modules), MiniMax-H3's fused gated
  residual + RMSNorm + AdaLN, called with ``residual = x``, ``gate = -0.0``, ``branch = 0`` so
  that ``residual_out = x + (-0.0) * 0 = x`` exactly (``x + (-0.0)`` is ``x`` for every x,
  signed zeros included; ``+0.0`` would turn ``x = -0.0`` into ``+0.0``); we take
  ``modulated_out`` and check ``residual_out`` against ``x``. 0.30.0 rounds ``residual_out``
  through bfloat16 for every dtype (so only in bfloat16 is it ``x``): the row takes bfloat16
  only, in both versions. Forward only; its CPU branch runs on ``cpu``.
"""

from __future__ import annotations

import torch

from gate_residual_matrix.contract.library import LibraryImplementation
from gate_residual_matrix.ops.rms_norm import EPS

LIGER = "liger_kernel.ops.modulated_rms_norm"
CASTING_MODES = ("llama", "gemma", "none")
OMNI_LAYERS = "vllm_omni.diffusion.layers.indexed_modulation"                  # 0.30.0
OMNI_ATTENTION_OPS = "vllm_omni.diffusion.attention.ops.minimax_h3_modulation"  # 0.28.0
LIGER_READ = "liger-kernel 0.8.4 and 0.8.5"
OMNI_READ = "vllm-omni 0.28.0 and 0.30.0"


def _liger_run(mode: str):
    name = f"liger_modulated_rms_norm_{mode}"

    def run(inputs, *, backward: bool, impl=None) -> dict[str, torch.Tensor]:
        """``LigerModulatedRMSNormFunction.apply(x, weight, scale[index], shift[index], eps,
        0.0, mode, True)``; with ``backward``, grads of x, weight, scale and shift (the last
        two through torch's gather) for a copy of ``grad_out``."""
        impl = impl or _BY_NAME[name]
        index = inputs["index"]
        x, weight, scale, shift = (inputs[k].detach().requires_grad_(backward)
                                   for k in ("x", "weight", "scale", "shift"))
        with torch.enable_grad() if backward else torch.no_grad():
            out = impl.call(x, weight, scale.index_select(0, index),
                            shift.index_select(0, index), EPS, 0.0, mode, True)
        if not backward:
            return {"out": out}
        grads = torch.autograd.grad(out, (x, weight, scale, shift),
                                    inputs["grad_out"].clone())  # in_place=True writes dX
        return {"out": out.detach(), "x": grads[0], "weight": grads[1], "scale": grads[2],
                "shift": grads[3]}

    run.__qualname__ = f"run_{name}"
    return run


def _liger_row(mode: str) -> LibraryImplementation:
    return LibraryImplementation(
        name=f"liger_modulated_rms_norm_{mode}",
        source=(f"Liger-Kernel {LIGER}:LigerModulatedRMSNormFunction on scale[index], "
                f"shift[index] (gathered by torch), casting_mode={mode!r}, offset=0.0, "
                f"in_place=True (Triton; read in {LIGER_READ})"),
        has_backward=True,
        run=_liger_run(mode),
        targets=("cuda",),
        distribution="liger-kernel",
        entries=(f"{LIGER}:LigerModulatedRMSNormFunction.apply",),
        backend=lambda module: ("Triton _modulated_rms_norm_forward_kernel / "
                                "_modulated_rms_norm_backward_kernel"),
        notes=("Triton only: no CPU path, cuda only",
               "scale/shift rows gathered per token by torch; grad_scale/grad_shift are "
               "Liger's per-row grads summed by index_select's backward (atomics on CUDA)",
               "in_place=True (Liger's default) overwrites a copy of grad_out with grad_x"),
    )


def run_omni(inputs, *, backward: bool, impl=None) -> dict[str, torch.Tensor]:
    """``rms_norm_indexed_scale_shift(x, weight, shift, scale, index, eps)``; forward only."""
    impl = impl or VLLM_OMNI_RMS_NORM_SCALE_SHIFT
    return {"out": impl.call(inputs["x"], inputs["weight"], inputs["shift"], inputs["scale"],
                             inputs["index"], EPS)}


def same_bits_or_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` (same shape and dtype) hold the same bits wherever either is
    not NaN, and NaN at the same places (a NaN's payload may change through float32)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    if not torch.equal(nan_a, nan_b):
        return False
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.view(ints)[~nan_a], b.view(ints)[~nan_b])


def run_omni_fused(inputs, *, backward: bool, impl=None) -> dict[str, torch.Tensor]:
    """``indexed_gate_rms_norm_scale_shift(x, -0.0, 0, weight, shift, scale, index, eps)``'s
    ``modulated_out``; ``RuntimeError`` when its ``residual_out`` is not ``x`` (then the
    modulated rows are not of our op's input). Forward only."""
    impl = impl or VLLM_OMNI_H3_FUSED_MODULATED
    impl.refuse_dtype(inputs["x"])
    x, scale = inputs["x"], inputs["scale"]
    gate = torch.full_like(scale, -0.0)
    residual_out, modulated_out = impl.call(x, gate, torch.zeros_like(x), inputs["weight"],
                                            inputs["shift"], scale, inputs["index"], EPS)
    if not same_bits_or_nan(residual_out, x):
        raise RuntimeError("indexed_gate_rms_norm_scale_shift's residual_out is not x "
                           "although gate = -0.0 and branch = 0: its modulated_out is not "
                           "RMSNorm(x) modulated")
    return {"out": modulated_out}


LIGER_ROWS = tuple(_liger_row(mode) for mode in CASTING_MODES)

VLLM_OMNI_RMS_NORM_SCALE_SHIFT = LibraryImplementation(
    name="vllm_omni_rms_norm_scale_shift",
    source=(f"vllm-omni rms_norm_indexed_scale_shift (Triton on CUDA, its torch branch on "
            f"CPU; paths read in {OMNI_READ})"),
    has_backward=False,
    run=run_omni,
    targets=("cuda", "cpu"),
    distribution="vllm-omni",
    entries=(f"{OMNI_LAYERS}:rms_norm_indexed_scale_shift",
             f"{OMNI_ATTENTION_OPS}:rms_norm_indexed_scale_shift"),
    backend=lambda module: ("Triton _rms_norm_indexed_scale_shift_kernel on CUDA tensors; "
                            "the function's own torch branch on CPU tensors"),
    notes=("on cpu the library's own CPU branch runs (torch: RMSNorm rounded to x's dtype, "
           "then the modulation in that dtype), on cuda its Triton kernel (float32, one "
           "rounding)",),
)

VLLM_OMNI_H3_FUSED_MODULATED = LibraryImplementation(
    name="vllm_omni_h3_fused_modulated",
    source=("vllm-omni indexed_gate_rms_norm_scale_shift, MiniMax-H3's fused gated residual + "
            "RMSNorm + AdaLN: modulated_out with residual = x, gate = -0.0, branch = 0 "
            f"supplied by us (Triton on CUDA, its torch branch on CPU; paths read in "
            f"{OMNI_READ})"),
    has_backward=False,
    run=run_omni_fused,
    targets=("cuda", "cpu"),
    distribution="vllm-omni",
    entries=(f"{OMNI_LAYERS}:indexed_gate_rms_norm_scale_shift",
             f"{OMNI_ATTENTION_OPS}:indexed_gate_rms_norm_scale_shift"),
    backend=lambda module: ("Triton _indexed_gate_rms_norm_scale_shift_kernel on CUDA "
                            "tensors; the function's own torch branch on CPU tensors"),
    dtypes=("bfloat16",),
    notes=("gate = -0.0 and branch = 0 make residual_out = x exactly (x + (-0.0) keeps -0.0; "
           "+0.0 would not); residual_out is checked against x on every call",
           "bfloat16 only: vllm-omni 0.30.0 rounds residual_out through bfloat16 for every "
           "dtype, so in float16/float32 its modulated_out normalizes bf16(x), not x"),
)

LIBRARIES = (*LIGER_ROWS, VLLM_OMNI_RMS_NORM_SCALE_SHIFT, VLLM_OMNI_H3_FUSED_MODULATED)
_BY_NAME = {row.name: row for row in LIBRARIES}
