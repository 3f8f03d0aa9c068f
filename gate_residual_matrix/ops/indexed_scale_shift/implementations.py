"""indexed_scale_shift's implementations, in the order a matrix lists them: ``eager`` (the
baseline), ``numba`` (ours: ``kernels/indexed_scale_shift.py`` and its CPU twin), ``fp64``
(accuracy reference), ``compiled`` / ``compiled_emulate`` (torch.compile) and the library
rows (:mod:`ops.indexed_scale_shift.libraries`)."""

from __future__ import annotations

from gate_residual_matrix.ops.indexed_scale_shift import (
                   compiled,
                   eager,
                   fp64,
                   libraries,
                   numba_kernel,
)

IMPLEMENTATIONS = (eager.EAGER, numba_kernel.NUMBA, fp64.FP64, compiled.COMPILED,
                   compiled.COMPILED_EMULATE, *libraries.LIBRARIES)
