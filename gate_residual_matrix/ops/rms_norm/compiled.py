"""``compiled`` and ``compiled_emulate``: ``torch.compile`` of :func:`expression`, diffusers'
RMSNorm (as ``ops/gate_residual/compiled.py``: ``dynamic=False``, autograd's backward compiled
by inductor, ``emulate_precision_casts`` around the second one's calls)."""

from __future__ import annotations

import torch

from gate_residual_matrix.ops.rms_norm.eager import diffusers_rms_norm
from gate_residual_matrix.ops.torch_compile import Compiled, missing_compiler
from gate_residual_matrix.runner.implementations import Implementation


def expression(x, weight):
    """diffusers' RMSNorm (:func:`ops.rms_norm.eager.diffusers_rms_norm`), traced."""
    return diffusers_rms_norm(x, weight)


def _expression_emulate(x, weight):
    """:func:`expression` again: a second code object, so its compiled graphs are its own."""
    return diffusers_rms_norm(x, weight)


_COMPILE = Compiled("rms_norm", expression, _expression_emulate)


def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """:func:`expression` through ``torch.compile`` (inductor defaults, dynamic=False)."""
    return _COMPILE.run(inputs, backward=backward, emulate=False)


def run_emulate(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """As :func:`run`, with inductor's ``emulate_precision_casts`` on while it compiles."""
    return _COMPILE.run(inputs, backward=backward, emulate=True)


COMPILED = Implementation(
    name="compiled",
    source="torch.compile(diffusers RMSNorm), inductor defaults, dynamic=False",
    has_backward=True,
    run=run,
    code_path="torch.compile(ops.rms_norm.compiled.expression, dynamic=False)",
    prerequisite=missing_compiler,
    compiles_per_shape=True,
)

COMPILED_EMULATE = Implementation(
    name="compiled_emulate",
    source="as compiled, with torch._inductor.config.emulate_precision_casts = True",
    has_backward=True,
    run=run_emulate,
    code_path=("torch.compile(ops.rms_norm.compiled._expression_emulate, dynamic=False) "
               "under inductor emulate_precision_casts=True"),
    prerequisite=missing_compiler,
    compiles_per_shape=True,
)
