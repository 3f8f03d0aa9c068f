"""Library implementations: called when their package imports in the stack, else
``unavailable`` with the import that failed. Never re-implemented here.

Import paths, read in the libraries' sources (not installed on the CPU machine):

- ``sglang_indexed_gate_triton``: sglang >= 0.5.23,
  ``sglang.kernels.ops.diffusion.modulate.indexed_modulation_triton.indexed_gate_bf16(x,
  gate, other, indices)`` = ``x + bf16(gate[indices] * other)``; bfloat16 only, CUDA,
  forward only (its in-place twin ``indexed_gate_bf16_`` writes into ``x``).
- ``sglang_residual_gate_add_jit``: ``sglang.kernels.ops.diffusion.modulate.
  residual_gate_add_jit.residual_gate_add_cuda(residual, update, gate)`` on a pre-gathered
  gate (``gate.index_select(0, index)``), fp16/bf16/fp32, CUDA, forward only. We call the
  ``_cuda`` entry, not ``residual_gate_add``, because the latter falls back to eager
  silently when the JIT build fails: the code path that runs must be the one recorded.
- ``vllm_omni_gated_residual`` and ``rl_kernel_h3``: the packages are checked; their entry
  points are not yet confirmed in an installed copy, so they stay ``unavailable`` with that
  reason even where the package imports (``not_wired``), rather than guess a call.

SGLang's JIT variant of the indexed gate was not found in the sources read (only the
Triton one and the pre-gathered JIT ``residual_gate_add``).
"""

from __future__ import annotations

import torch

from runner.implementations import Implementation

SGL_MODULATE = "sglang.kernels.ops.diffusion.modulate"
SGL_TRITON = f"{SGL_MODULATE}.indexed_modulation_triton"
SGL_JIT = f"{SGL_MODULATE}.residual_gate_add_jit"


def run_sglang_indexed_gate_triton(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """``indexed_gate_bf16(residual, gate, y, index)`` (forward only; bfloat16 only)."""
    from sglang.kernels.ops.diffusion.modulate.indexed_modulation_triton import (
        indexed_gate_bf16,
    )

    if inputs["residual"].dtype != torch.bfloat16:
        raise TypeError(f"{SGL_TRITON}.indexed_gate_bf16 takes bfloat16 only, got "
                        f"{inputs['residual'].dtype}")
    return {"out": indexed_gate_bf16(inputs["residual"], inputs["gate"], inputs["y"],
                                     inputs["index"])}


def run_sglang_residual_gate_add_jit(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """``residual_gate_add_cuda(residual, y, gate.index_select(0, index))`` (forward only)."""
    from sglang.kernels.ops.diffusion.modulate.residual_gate_add_jit import (
        residual_gate_add_cuda,
    )

    gathered = inputs["gate"].index_select(0, inputs["index"])
    return {"out": residual_gate_add_cuda(inputs["residual"], inputs["y"], gathered)}


def _not_wired(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    raise NotImplementedError("entry point not wired: see runner/implementations/libraries.py")


SGLANG_INDEXED_GATE_TRITON = Implementation(
    name="sglang_indexed_gate_triton",
    source=f"SGLang {SGL_TRITON}.indexed_gate_bf16 (Triton)",
    has_backward=False,
    run=run_sglang_indexed_gate_triton,
    targets=("cuda",),
    requires=("triton", SGL_TRITON),
    code_path=f"{SGL_TRITON}.indexed_gate_bf16",
)

SGLANG_RESIDUAL_GATE_ADD_JIT = Implementation(
    name="sglang_residual_gate_add_jit",
    source=f"SGLang {SGL_JIT}.residual_gate_add_cuda on gate.index_select(0, index) (JIT CUDA)",
    has_backward=False,
    run=run_sglang_residual_gate_add_jit,
    targets=("cuda",),
    requires=(SGL_JIT,),
    code_path=f"{SGL_JIT}.residual_gate_add_cuda",
)

VLLM_OMNI_GATED_RESIDUAL = Implementation(
    name="vllm_omni_gated_residual",
    source="vllm-omni gated residual / MiniMax-H3 fused op",
    has_backward=False,
    run=_not_wired,
    targets=("cuda",),
    requires=("vllm_omni",),
    not_wired="vllm_omni imports, but its gated-residual entry point is not yet confirmed in "
              "an installed copy (runner/implementations/libraries.py)",
)

RL_KERNEL_H3 = Implementation(
    name="rl_kernel_h3",
    source="RL-Kernel H3 gate residual op",
    has_backward=False,
    run=_not_wired,
    targets=("cuda",),
    requires=("rl_kernel",),
    not_wired="rl_kernel imports, but its H3 gate-residual entry point is not yet confirmed "
              "in an installed copy (runner/implementations/libraries.py)",
)

LIBRARIES = (SGLANG_INDEXED_GATE_TRITON, SGLANG_RESIDUAL_GATE_ADD_JIT,
             VLLM_OMNI_GATED_RESIDUAL, RL_KERNEL_H3)
