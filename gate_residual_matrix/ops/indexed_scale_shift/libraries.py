"""Library rows of indexed_scale_shift (forward only, CUDA, each in place into its ``x`` clone:
``mutated_inputs`` lists ``x``), through :mod:`contract.library` as
gate_residual's library rows.

Read in the wheels' files of this project's kernel wheelhouse (``.carry/kernel-wheelhouse``):

- SGLang ``sglang.kernels.ops.diffusion.modulate.indexed_modulation_triton``:
  ``indexed_scale_shift_bf16_(x, shift, scale, indices) -> x`` (sglang 0.5.21, 0.5.22,
  0.5.23), Triton ``_indexed_scale_shift_bf16_kernel``: ``t = bf16(1 + scale)``,
  ``p = bf16(x * t)``, ``x = bf16(p + shift)`` in float32; bfloat16 only (its name).
- vllm-omni ``vllm_omni.diffusion.layers.indexed_modulation`` (0.30.0;
  ``vllm_omni.diffusion.attention.ops.minimax_h3_modulation`` in 0.28.0):
  ``indexed_scale_shift_(x, shift, scale, indices) -> x``, Triton
  ``_indexed_scale_shift_kernel``: ``x * (1 + scale) + shift`` in float32, rounded once.
  (On a CPU tensor it runs the eager expression instead: the row is ``cuda`` only.)

Both take ``shift`` before ``scale``.
"""

from __future__ import annotations

import torch

from gate_residual_matrix.contract.library import LibraryImplementation

SGLANG_TRITON = "sglang.kernels.ops.diffusion.modulate.indexed_modulation_triton"
VLLM_LAYERS = "vllm_omni.diffusion.layers.indexed_modulation"             # 0.30.0
VLLM_ATTENTION_OPS = "vllm_omni.diffusion.attention.ops.minimax_h3_modulation"  # 0.28.0


def run_sglang(inputs, *, backward: bool, impl=None) -> dict[str, torch.Tensor]:
    """``indexed_scale_shift_bf16_(x, shift, scale, index)``, into ``x``; forward only.
    ``impl``: the calling row (a versioned one), default :data:`SGLANG_SCALE_SHIFT`."""
    impl = impl or SGLANG_SCALE_SHIFT
    impl.refuse_dtype(inputs["x"])
    return {"out": impl.call(inputs["x"], inputs["shift"], inputs["scale"], inputs["index"])}


def run_vllm_omni(inputs, *, backward: bool, impl=None) -> dict[str, torch.Tensor]:
    """``indexed_scale_shift_(x, shift, scale, index)``, into ``x``; forward only."""
    impl = impl or VLLM_OMNI_SCALE_SHIFT
    return {"out": impl.call(inputs["x"], inputs["shift"], inputs["scale"], inputs["index"])}


SGLANG_SCALE_SHIFT = LibraryImplementation(
    name="sglang_indexed_scale_shift_triton",
    source=(f"SGLang {SGLANG_TRITON}:indexed_scale_shift_bf16_ (Triton, in place into x; "
            "paths read in sglang 0.5.21, 0.5.22, 0.5.23)"),
    has_backward=False,
    run=run_sglang,
    targets=("cuda",),
    distribution="sglang",
    entries=(f"{SGLANG_TRITON}:indexed_scale_shift_bf16_",),
    backend=lambda module: "Triton _indexed_scale_shift_bf16_kernel, output aliases x",
    dtypes=("bfloat16",),
    notes=("writes into its x clone: mutated_inputs lists x",),
)

VLLM_OMNI_SCALE_SHIFT = LibraryImplementation(
    name="vllm_omni_indexed_scale_shift",
    source=("vllm-omni indexed_scale_shift_ (Triton, in place into x; paths read in "
            "vllm-omni 0.28.0 and 0.30.0)"),
    has_backward=False,
    run=run_vllm_omni,
    targets=("cuda",),
    distribution="vllm-omni",
    entries=(f"{VLLM_LAYERS}:indexed_scale_shift_",
             f"{VLLM_ATTENTION_OPS}:indexed_scale_shift_"),
    backend=lambda module: "Triton _indexed_scale_shift_kernel, output aliases x",
    notes=("writes into its x clone: mutated_inputs lists x",),
)

LIBRARIES = (SGLANG_SCALE_SHIFT, VLLM_OMNI_SCALE_SHIFT)
