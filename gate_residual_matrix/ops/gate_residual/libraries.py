"""The library implementations: each calls the library's own function by its exact import
path when the package imports in the stack, and is ``unavailable`` with every failed import
named when it does not. Never re-implemented here.

How they are called, recorded and checked: :mod:`contract.library`. The paths,
signatures and the versions they were read from: the modules below.

====================================  ==========================================================
``sglang_indexed_gate_triton``        ``sglang.kernels.ops.diffusion.modulate.
                                      indexed_modulation_triton:indexed_gate_bf16``
``sglang_indexed_gate_triton_inplace``  the same module's ``indexed_gate_bf16_`` (writes into
                                      ``residual``)
``sglang_residual_gate_add_jit``      ``sglang.kernels.kda_kernels.residual_gate_add_jit:
                                      residual_gate_add_cuda`` on a gate gathered by torch
``vllm_omni_gated_residual``          ``vllm_omni.diffusion.layers.indexed_modulation:
                                      indexed_gate`` (0.30; 0.28: ``...attention.ops.
                                      minimax_h3_modulation``)
``vllm_omni_h3_fused``                the same modules' ``indexed_gate_rms_norm_scale_shift``
``rl_kernel_h3``                      ``rl_engine.kernels.ops.cuda.h3.gate_residual:
                                      H3GateResidualCudaOp`` (forward and backward)
====================================  ==========================================================

Only ``rl_kernel_h3`` has a backward; the others are forward only (``has_backward: false``:
their grads are absent from the report, not zero).
"""

from __future__ import annotations

from gate_residual_matrix.ops.gate_residual import rl_kernel_ops, sglang_ops, vllm_omni_ops

SGLANG_INDEXED_GATE_TRITON = sglang_ops.INDEXED_GATE_TRITON
SGLANG_INDEXED_GATE_TRITON_INPLACE = sglang_ops.INDEXED_GATE_TRITON_INPLACE
SGLANG_RESIDUAL_GATE_ADD_JIT = sglang_ops.RESIDUAL_GATE_ADD
VLLM_OMNI_GATED_RESIDUAL = vllm_omni_ops.GATED_RESIDUAL
VLLM_OMNI_H3_FUSED = vllm_omni_ops.H3_FUSED
RL_KERNEL_H3 = rl_kernel_ops.RL_KERNEL_H3

LIBRARIES = (*sglang_ops.SGLANG, *vllm_omni_ops.VLLM_OMNI, RL_KERNEL_H3)
