"""``compiled`` and ``compiled_emulate``: ``torch.compile`` of diffusers' RMSNorm
(:func:`ops.torch_compile.compiled_rows`: ``dynamic=False``, autograd's backward compiled by
inductor, ``emulate_precision_casts`` around the second one's calls)."""

from __future__ import annotations

from gate_residual_matrix.ops.rms_norm.eager import diffusers_rms_norm
from gate_residual_matrix.ops.torch_compile import compiled_rows


def expression(x, weight):
    """:func:`ops.rms_norm.eager.diffusers_rms_norm`, traced."""
    return diffusers_rms_norm(x, weight)


def _expression_emulate(x, weight):
    """:func:`expression` again: a second code object, so its compiled graphs are its own."""
    return diffusers_rms_norm(x, weight)


COMPILED, COMPILED_EMULATE = compiled_rows("rms_norm", expression, _expression_emulate,
                                           "diffusers RMSNorm")
