"""gate_residual's inputs by its sizes: ``residual``, ``y``, ``grad_out`` (N, D); ``gate``
(G, D); ``index`` (N,) in [0, G), built by :func:`contract.inputs.build` from the spec.

Example::

    >>> from gate_residual_matrix.ops.gate_residual.inputs import make_inputs
    >>> x = make_inputs(n=257, d=64, g=9, dtype="bfloat16", index_dtype="int64", seed=1)
    >>> sorted(x.tensors)
    ['gate', 'grad_out', 'index', 'residual', 'y']
"""

from __future__ import annotations

from gate_residual_matrix.contract.inputs import CaseInputs, build
from gate_residual_matrix.ops.gate_residual import SPEC


def make_inputs(*, n: int, d: int, g: int, dtype: str, index_dtype: str, seed: int,
                specials: bool = False, case_id: str | None = None) -> CaseInputs:
    """One case's inputs (CPU tensors) for ``n`` rows, hidden size ``d`` and ``g`` gate
    rows; the other arguments as :func:`contract.inputs.make_tensors` takes them."""
    return build(SPEC, n=n, sizes={"D": d, "G": g}, dtype=dtype, index_dtype=index_dtype,
                 seed=seed, specials=specials, case_id=case_id)
