"""gate_residual's implementations, in the order a matrix lists them.

``eager`` (the baseline), ``numba`` (ours: ``kernels/gate_residual.py`` and its CPU twin),
``fp64`` (accuracy reference), ``compiled`` / ``compiled_emulate`` (torch.compile) and the
library rows (:mod:`ops.gate_residual.libraries`). With ``GATE_RESIDUAL_FAULTS=1`` the
test-only fault injectors of :mod:`ops.gate_residual.faulty` are added.
"""

from __future__ import annotations

from gate_residual_matrix import settings
from gate_residual_matrix.contract.base import Implementation
from gate_residual_matrix.ops.gate_residual import compiled, eager, fp64, libraries, numba_kernel

IMPLEMENTATIONS: tuple[Implementation, ...] = (
    eager.EAGER, numba_kernel.NUMBA, fp64.FP64, compiled.COMPILED, compiled.COMPILED_EMULATE,
    *libraries.LIBRARIES)

if settings.get("GATE_RESIDUAL_FAULTS"):
    from gate_residual_matrix.ops.gate_residual import faulty

    IMPLEMENTATIONS += (faulty.FAULT, *faulty.TEST_ONLY)
