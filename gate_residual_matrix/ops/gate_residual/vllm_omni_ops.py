"""vllm-omni's MiniMax-H3 gate ops, called by their exact paths (forward only, CUDA).

Read in the wheels of vllm-omni 0.26.0, 0.28.0 and 0.30.0 (``pip download --no-deps``).
0.26.0 has no such op (its MiniMax-H3 computes ``(x + gate.index_select(0, indices) *
other).to(dtype)`` in torch). The module moved between 0.28.0 and 0.30.0; the functions and
their signatures did not:

- 0.30.0: ``vllm_omni.diffusion.layers.indexed_modulation``
- 0.28.0: ``vllm_omni.diffusion.attention.ops.minimax_h3_modulation``

``indexed_gate(x, gate, other, indices) -> Tensor``: Triton ``_indexed_gate_kernel``, one
program per row, ``x + gate[indices] * other`` in float32 and one rounding to ``x``'s dtype
(no rounding of the product, unlike eager). On CPU tensors it computes the torch expression
instead, so we run it on ``cuda`` only.

``indexed_gate_rms_norm_scale_shift(residual, gate, branch, weight, shift, scale, indices,
eps) -> (residual_out, modulated_out)``: MiniMax-H3's fused gated residual + RMSNorm + AdaLN
(Triton ``_indexed_gate_rms_norm_scale_shift_kernel``). ``residual_out`` is our op; we pass
``weight`` = 1, ``shift`` = ``scale`` = 0 and ``eps`` = 1e-6 (only ``modulated_out``, which
we discard, depends on them). 0.30.0 rounds ``residual_out`` through bfloat16 whatever the
dtype (MiniMax-H3 runs bf16); 0.28.0 rounds once to the residual's dtype.

Importing these modules imports ``vllm_omni`` (which applies its patches to vllm) and
``vllm.triton_utils``: vllm must be installed, of the same minor version.
"""

from __future__ import annotations

import torch

from gate_residual_matrix.contract.library import LibraryImplementation

LAYERS = "vllm_omni.diffusion.layers.indexed_modulation"             # 0.30.0
ATTENTION_OPS = "vllm_omni.diffusion.attention.ops.minimax_h3_modulation"  # 0.28.0
VERSIONS_READ = "vllm-omni 0.28.0 and 0.30.0"
H3_EPS = 1e-6


def run_gated_residual(inputs, *, backward: bool, impl=None) -> dict[str, torch.Tensor]:
    """``indexed_gate(residual, gate, y, index)``; forward only. ``impl``: the calling row
    (a versioned one), default :data:`GATED_RESIDUAL`."""
    return {"out": (impl or GATED_RESIDUAL).call(inputs["residual"], inputs["gate"], inputs["y"],
                                                 inputs["index"])}


def run_h3_fused(inputs, *, backward: bool, impl=None) -> dict[str, torch.Tensor]:
    """``indexed_gate_rms_norm_scale_shift(residual, gate, y, 1, 0, 0, index, 1e-6)[0]``."""
    residual, gate = inputs["residual"], inputs["gate"]
    weight = torch.ones(residual.shape[-1], dtype=residual.dtype, device=residual.device)
    zeros = torch.zeros_like(gate)
    residual_out, _modulated = (impl or H3_FUSED).call(residual, gate, inputs["y"], weight,
                                                       zeros, zeros, inputs["index"], H3_EPS)
    return {"out": residual_out}


GATED_RESIDUAL = LibraryImplementation(
    name="vllm_omni_gated_residual",
    source=f"vllm-omni indexed_gate (Triton; paths read in {VERSIONS_READ})",
    has_backward=False,
    run=run_gated_residual,
    targets=("cuda",),
    distribution="vllm-omni",
    entries=(f"{LAYERS}:indexed_gate", f"{ATTENTION_OPS}:indexed_gate"),
    backend=lambda module: "Triton _indexed_gate_kernel",
)

H3_FUSED = LibraryImplementation(
    name="vllm_omni_h3_fused",
    source=("vllm-omni indexed_gate_rms_norm_scale_shift, MiniMax-H3's fused gated residual "
            "+ RMSNorm + AdaLN; residual_out taken, weight=1, shift=scale=0, eps=1e-6 "
            f"supplied by us (Triton; paths read in {VERSIONS_READ})"),
    has_backward=False,
    run=run_h3_fused,
    targets=("cuda",),
    distribution="vllm-omni",
    entries=(f"{LAYERS}:indexed_gate_rms_norm_scale_shift",
             f"{ATTENTION_OPS}:indexed_gate_rms_norm_scale_shift"),
    backend=lambda module: "Triton _indexed_gate_rms_norm_scale_shift_kernel",
    notes=("weight, shift, scale and eps are ours; only the discarded modulated_out uses them",
           "vllm-omni 0.30.0 rounds residual_out through bfloat16 for every dtype"),
)

VLLM_OMNI = (GATED_RESIDUAL, H3_FUSED)
