"""``compiled`` and ``compiled_emulate``: ``torch.compile`` of diffusers' RMSNorm and the modulation
(:func:`ops.torch_compile.compiled_rows`: ``dynamic=False``, autograd's backward compiled by
inductor, ``emulate_precision_casts`` around the second one's calls)."""

from __future__ import annotations

from gate_residual_matrix.ops.rms_norm_scale_shift.eager import expression as _eager
from gate_residual_matrix.ops.torch_compile import compiled_rows


def expression(x, weight, scale, shift, index):
    """:func:`ops.rms_norm_scale_shift.eager.expression`, traced."""
    return _eager(x, weight, scale, shift, index)


def _expression_emulate(x, weight, scale, shift, index):
    """:func:`expression` again: a second code object, so its compiled graphs are its own."""
    return _eager(x, weight, scale, shift, index)


COMPILED, COMPILED_EMULATE = compiled_rows("rms_norm_scale_shift", expression, _expression_emulate,
                                           "diffusers RMSNorm, then the modulation")
