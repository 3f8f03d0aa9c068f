"""What an implementation is, and the registry of each op's implementations.

An implementation is a name, a ``source`` string (as in the reference report), whether it
has a backward, and a callable. An op's implementations live in its folder
(``ops/<op>/implementations.py``, ``IMPLEMENTATIONS``); adding one is one small module
there that defines an :class:`Implementation` and one entry in that tuple (and its name in
the spec's ``implementation_names``).

Calling convention: ``impl.run(inputs, backward=...)`` where ``inputs`` maps the op's input
names (:attr:`ops.spec.OpSpec.inputs` and its ``index``) to tensors already on the cell's
target device (the runner clones them for every call and checks that no input changed: see
:mod:`runner.cell`). It returns the forward output (:attr:`ops.spec.OpSpec.forward`) and,
with ``backward=True`` and ``has_backward``, the gradients (:attr:`ops.spec.OpSpec.grads`)
for the upstream gradient (:attr:`ops.spec.OpSpec.upstream`). An accuracy reference may
return a :class:`runner.row_blocks.RowBlocks` for an output whose rows each depend on the
same rows of the inputs alone: the runner reads it block by block (accuracy figures, sha256)
and never holds it whole.
"""

from __future__ import annotations

from gate_residual_matrix.runner.implementations.base import Implementation, Tensors
from gate_residual_matrix.runner.implementations.catalog import get, known, lookup, registry, rows

__all__ = ["Implementation", "Tensors", "get", "known", "lookup", "registry", "rows"]
