"""``compiled`` and ``compiled_emulate``: ``torch.compile`` of the eager expression.

Both compile :func:`expression` (``residual + gate.index_select(0, index) * y``) with
inductor's defaults except ``dynamic=False``: every N gets its own static graph, so the
bits of a case do not depend on which cases ran before it in the process (with the default,
the second shape seen recompiles with dynamic shapes). The backward is autograd's, compiled
by inductor through AOTAutograd. ``compiled_emulate`` sets
``torch._inductor.config.emulate_precision_casts = True`` with
``torch._inductor.config.patch`` around its calls (compilation of the forward and the
backward happens inside them), so the setting does not leak into ``compiled``; the two
wrap separate function objects, so neither reuses the other's graphs. ``run_dynamic`` (the
batch-invariance size sweep's entry) calls the same expression through a graph with N
dynamic (:class:`ops.torch_compile.Compiled`), as vLLM compiles a model.

Issue 4 (H200, torch 2.11): ``compiled`` differs from eager in about 23% of forward
elements for bf16, fp16 and fp32; ``compiled_emulate`` in none.

Both need a compiler on the machine: inductor's CPU code is C++ (``g++`` or ``CXX``), and
Triton builds a C launcher for its GPU kernels (``cc``/``gcc`` or ``CC``); where none is
found the implementation is ``unavailable`` with that reason (:func:`missing_compiler`). Any
other compilation failure raises from the call: the cell records the implementation as
``error`` with the reason and goes on.
Recompiles are allowed up to :data:`RECOMPILE_LIMIT` shapes, and hitting the limit raises
rather than falling back to eager silently.
"""

from __future__ import annotations

import torch

from gate_residual_matrix.contract.base import Implementation
from gate_residual_matrix.ops.torch_compile import RECOMPILE_LIMIT, Compiled, missing_compiler

__all__ = ["COMPILED", "COMPILED_EMULATE", "RECOMPILE_LIMIT", "expression", "missing_compiler"]


def expression(residual, gate, y, index):
    """The eager expression, the function both implementations compile."""
    return residual + gate.index_select(0, index) * y


def _expression_emulate(residual, gate, y, index):
    """:func:`expression` again: a second code object, so its compiled graphs are its own."""
    return residual + gate.index_select(0, index) * y


_COMPILE = Compiled("gate_residual", expression, _expression_emulate)


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
    source="torch.compile(residual + gate.index_select(0, index) * y), inductor defaults, "
           "dynamic=False",
    has_backward=True,
    run=run,
    run_dynamic=run_dynamic,
    code_path="torch.compile(ops.gate_residual.compiled.expression, dynamic=False)",
    prerequisite=missing_compiler,
    compiles_per_shape=True,
)

COMPILED_EMULATE = Implementation(
    name="compiled_emulate",
    source="as compiled, with torch._inductor.config.emulate_precision_casts = True",
    has_backward=True,
    run=run_emulate,
    run_dynamic=run_emulate_dynamic,
    code_path=("torch.compile(ops.gate_residual.compiled._expression_emulate, "
               "dynamic=False) under inductor emulate_precision_casts=True"),
    prerequisite=missing_compiler,
    compiles_per_shape=True,
)
