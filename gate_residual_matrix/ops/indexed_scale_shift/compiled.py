"""``compiled`` and ``compiled_emulate``: ``torch.compile`` of the eager expression.

As gate_residual's (``ops/gate_residual/compiled.py``: ``dynamic=False``, autograd's backward
compiled by inductor, ``emulate_precision_casts`` patched around the second one's calls,
unavailable without a compiler on PATH), over :func:`expression`.
"""

from __future__ import annotations

import torch

from gate_residual_matrix.contract.base import Implementation
from gate_residual_matrix.ops.torch_compile import RECOMPILE_LIMIT, Compiled, missing_compiler

__all__ = ["COMPILED", "COMPILED_EMULATE", "RECOMPILE_LIMIT", "expression", "missing_compiler"]


def expression(x, scale, shift, index):
    """The eager expression, the function ``compiled`` compiles."""
    return x * (1 + scale.index_select(0, index)) + shift.index_select(0, index)


def _expression_emulate(x, scale, shift, index):
    """:func:`expression` again: a second code object, so its compiled graphs are its own."""
    return x * (1 + scale.index_select(0, index)) + shift.index_select(0, index)


_COMPILE = Compiled("indexed_scale_shift", expression, _expression_emulate)


def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """The eager expression through ``torch.compile`` (inductor defaults, dynamic=False)."""
    return _COMPILE.run(inputs, backward=backward, emulate=False)


def run_emulate(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """As :func:`run`, with inductor's ``emulate_precision_casts`` on while it compiles."""
    return _COMPILE.run(inputs, backward=backward, emulate=True)


def run_dynamic(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """As :func:`run`, through the graph with N dynamic (the batch-invariance size sweep)."""
    return _COMPILE.run(inputs, backward=backward, emulate=False, dynamic_rows=True)


def run_emulate_dynamic(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """As :func:`run_emulate`, through the graph with N dynamic."""
    return _COMPILE.run(inputs, backward=backward, emulate=True, dynamic_rows=True)


COMPILED = Implementation(
    name="compiled",
    source="torch.compile(x * (1 + scale.index_select(0, index)) + shift.index_select(0, "
           "index)), inductor defaults, dynamic=False",
    has_backward=True,
    run=run,
    run_dynamic=run_dynamic,
    code_path="torch.compile(ops.indexed_scale_shift.compiled.expression, dynamic=False)",
    prerequisite=missing_compiler,
    compiles_per_shape=True,
)

COMPILED_EMULATE = Implementation(
    name="compiled_emulate",
    source="as compiled, with torch._inductor.config.emulate_precision_casts = True",
    has_backward=True,
    run=run_emulate,
    run_dynamic=run_emulate_dynamic,
    code_path=("torch.compile(ops.indexed_scale_shift.compiled._expression_emulate, "
               "dynamic=False) under inductor emulate_precision_casts=True"),
    prerequisite=missing_compiler,
    compiles_per_shape=True,
)
