"""rms_norm_scale_shift's implementations, in the order a matrix lists them: ``eager`` (the
baseline), ``eager_functional``, ``numba`` (ours), ``fp64`` (accuracy reference),
``compiled`` / ``compiled_emulate`` and the library rows
(:mod:`ops.rms_norm_scale_shift.libraries`: Liger-Kernel's modulated RMSNorm on the trainer
side, vllm-omni's indexed RMSNorm modulation on the rollout side)."""

from __future__ import annotations

from gate_residual_matrix.ops.rms_norm_scale_shift import (
                   compiled,
                   eager,
                   fp64,
                   libraries,
                   numba_kernel,
)

IMPLEMENTATIONS = (eager.EAGER, eager.EAGER_FUNCTIONAL, numba_kernel.NUMBA, fp64.FP64,
                   compiled.COMPILED, compiled.COMPILED_EMULATE, *libraries.LIBRARIES)
