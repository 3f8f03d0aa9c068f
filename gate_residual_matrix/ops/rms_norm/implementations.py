"""rms_norm's implementations, in the order a matrix lists them: ``eager`` (diffusers'
RMSNorm, the baseline), ``eager_functional`` (``torch.nn.functional.rms_norm``), ``numba``
(ours: ``kernels/rms_norm*.py``), ``fp64`` (accuracy reference), ``compiled`` /
``compiled_emulate`` and the library rows (:mod:`ops.rms_norm.libraries`: Liger-Kernel on
the trainer side, vLLM on the rollout side)."""

from __future__ import annotations

from gate_residual_matrix.ops.rms_norm import compiled, eager, fp64, libraries, numba_kernel

IMPLEMENTATIONS = (eager.EAGER, eager.EAGER_FUNCTIONAL, numba_kernel.NUMBA, fp64.FP64,
                   compiled.COMPILED, compiled.COMPILED_EMULATE, *libraries.LIBRARIES)
