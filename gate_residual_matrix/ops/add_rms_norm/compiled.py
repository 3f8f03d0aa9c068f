"""``compiled`` and ``compiled_emulate``: ``torch.compile`` of ``h = x + residual`` and
diffusers' RMSNorm of ``h`` (:func:`ops.torch_compile.compiled_rows`: ``dynamic=False``,
autograd's backward compiled by inductor, ``emulate_precision_casts`` around the second one's
calls)."""

from __future__ import annotations

from gate_residual_matrix.ops.add_rms_norm.eager import expression as _eager
from gate_residual_matrix.ops.torch_compile import compiled_rows


def expression(x, residual, weight):
    """:func:`ops.add_rms_norm.eager.expression`: ``(out, h)``, traced."""
    return _eager(x, residual, weight)


def _expression_emulate(x, residual, weight):
    """:func:`expression` again: a second code object, so its compiled graphs are its own."""
    return _eager(x, residual, weight)


COMPILED, COMPILED_EMULATE = compiled_rows("add_rms_norm", expression, _expression_emulate,
                                           "h = x + residual; diffusers RMSNorm(h)")
