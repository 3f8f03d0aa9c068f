"""``compiled`` and ``compiled_emulate``: ``torch.compile`` of diffusers' RMSNorm and the
modulation (:func:`ops.rms_norm_scale_shift.eager.expression`; as :mod:`ops.rms_norm.compiled`)."""

from __future__ import annotations

import torch

from gate_residual_matrix.ops.rms_norm_scale_shift.eager import expression as _eager
from gate_residual_matrix.ops.torch_compile import Compiled, missing_compiler
from gate_residual_matrix.runner.implementations import Implementation


def expression(x, weight, scale, shift, index):
    """:func:`ops.rms_norm_scale_shift.eager.expression`, traced."""
    return _eager(x, weight, scale, shift, index)


def _expression_emulate(x, weight, scale, shift, index):
    """:func:`expression` again: a second code object, so its compiled graphs are its own."""
    return _eager(x, weight, scale, shift, index)


_COMPILE = Compiled("rms_norm_scale_shift", expression, _expression_emulate)


def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """:func:`expression` through ``torch.compile`` (inductor defaults, dynamic=False)."""
    return _COMPILE.run(inputs, backward=backward, emulate=False)


def run_emulate(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """As :func:`run`, with inductor's ``emulate_precision_casts`` on while it compiles."""
    return _COMPILE.run(inputs, backward=backward, emulate=True)


COMPILED = Implementation(
    name="compiled",
    source="torch.compile(diffusers RMSNorm, then the modulation), inductor defaults, "
           "dynamic=False",
    has_backward=True,
    run=run,
    code_path="torch.compile(ops.rms_norm_scale_shift.compiled.expression, dynamic=False)",
    prerequisite=missing_compiler,
    compiles_per_shape=True,
)

COMPILED_EMULATE = Implementation(
    name="compiled_emulate",
    source="as compiled, with torch._inductor.config.emulate_precision_casts = True",
    has_backward=True,
    run=run_emulate,
    code_path=("torch.compile(ops.rms_norm_scale_shift.compiled._expression_emulate, "
               "dynamic=False) under inductor emulate_precision_casts=True"),
    prerequisite=missing_compiler,
    compiles_per_shape=True,
)
