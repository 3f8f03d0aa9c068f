"""add_rms_norm's implementations, in the order a matrix lists them: ``eager`` (the
baseline), ``eager_functional``, ``numba`` (ours), ``fp64`` (accuracy reference),
``compiled`` / ``compiled_emulate`` and the library rows (:mod:`ops.add_rms_norm.libraries`:
Liger-Kernel's fused add + RMSNorm, vLLM's CUDA ``fused_add_rms_norm``)."""

from __future__ import annotations

from gate_residual_matrix.ops.add_rms_norm import compiled, eager, fp64, libraries, numba_kernel

IMPLEMENTATIONS = (eager.EAGER, eager.EAGER_FUNCTIONAL, numba_kernel.NUMBA, fp64.FP64,
                   compiled.COMPILED, compiled.COMPILED_EMULATE, *libraries.LIBRARIES)
