"""What every op's ``compiled`` rows share: the dynamo limits and inductor settings around
their calls, one call through autograd by the op's spec (:class:`Compiled`), and whether a
compiler is on PATH (``ops/<op>/compiled.py`` say why)."""

from __future__ import annotations

import contextlib
import types

import torch

RECOMPILE_LIMIT = 256
"""Shapes one compiled function may be compiled for; hitting it raises (no silent eager)."""


def settings(emulate: bool):
    """The dynamo recompile limit (raise at it) and, with ``emulate``, inductor's
    ``emulate_precision_casts``, as one context manager."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT,
                                                   fail_on_recompile_limit_hit=True))
    if emulate:
        stack.enter_context(torch._inductor.config.patch(emulate_precision_casts=True))
    return stack


def skip_guard_latency_profile() -> None:
    """Skip dynamo's one-off measurement of each new guard set's latency.

    When dynamo builds the guards of a new graph it times one evaluation of them after
    flushing the CPU caches, only to log the figure (``profile_guard_manager`` in
    torch/_dynamo/guards.py: "n_iters is chosen to be 1 to prevent excessive increase in
    compile time ... This cache flush is expensive"). A cuda cell builds about 420 guard
    sets, and py-spy on the H200 (2b61cde) put 7-8 s of a cell there. The guards, their
    checks and the compiled code are untouched; the logged latency reads 0. A torch
    without that function is left as it is."""
    guards = getattr(torch._dynamo, "guards", None)
    if guards is not None and hasattr(guards, "profile_guard_manager"):
        guards.profile_guard_manager = _no_guard_profile


def _no_guard_profile(*args, **kwargs) -> float:
    return 0.0


def missing_compiler(target: str) -> str | None:
    """Why torch.compile cannot build on ``target`` here, or None: the C++ compiler inductor
    uses for CPU code (``$CXX``, ``g++``, ``c++``, ``clang++``) or the C compiler Triton
    uses for its GPU launchers (``$CC``, ``cc``, ``gcc``, ``clang``)."""
    import shutil

    from gate_residual_matrix import settings

    env, names, what = (("CXX", ("g++", "c++", "clang++"), "a C++ compiler for inductor")
                        if target == "cpu" else
                        ("CC", ("cc", "gcc", "clang"), "a C compiler for Triton's launcher"))
    candidates = [settings.get(env)] if settings.get(env) else list(names)
    if any(shutil.which(c) for c in candidates):
        return None
    return f"torch.compile needs {what} and none is on PATH ({', '.join(candidates)})"


class Compiled:
    """``torch.compile(dynamic=False)`` of an op's eager ``expression`` (and of
    ``expression_emulate``, a second code object with graphs of its own, compiled under
    ``emulate_precision_casts``), called as the op's spec says: the expression takes the
    spec's floating inputs but the upstream gradients, in order, then the index (where the op
    has one); the backward is autograd's on the spec's upstream gradients. Each function is
    compiled once per process (lazily: the graphs per shape come with the calls).

    With ``dynamic_rows`` a call goes to a copy of the expression's code object (graphs of
    its own: dynamo keeps its cache per code object) whose row inputs have dimension 0
    marked dynamic (``torch._dynamo.mark_dynamic``, as vLLM compiles its models): one graph
    serves every N >= 2; N = 1 gets a graph of its own (dynamo specialises sizes 0 and 1).
    The other dimensions stay static. Example::

        rows = Compiled("gate_residual", expression, expression_emulate)
        rows.run(inputs, backward=True, emulate=False, dynamic_rows=True)
    """

    def __init__(self, op: str, expression, expression_emulate) -> None:
        self.op = op
        self._fns = {(emulate, dynamic): _own_code(fn) if dynamic else fn
                     for emulate, fn in ((False, expression), (True, expression_emulate))
                     for dynamic in (False, True)}
        self._compiled: dict[tuple[bool, bool], object] = {}

    def _fn(self, emulate: bool, dynamic_rows: bool = False):
        key = (emulate, dynamic_rows)
        if key not in self._compiled:
            skip_guard_latency_profile()
            # dynamic=False also for the dynamic-rows copy: no automatic dynamic shapes, so
            # only the dimensions marked by run() are symbolic
            self._compiled[key] = torch.compile(self._fns[key], dynamic=False)
        return self._compiled[key]

    def run(self, inputs, *, backward: bool, emulate: bool,
            dynamic_rows: bool = False) -> dict[str, torch.Tensor]:
        """The forward outputs (and, with ``backward``, each gradient of the spec's outputs),
        keyed as the spec's ``outputs``. An op with several forward outputs has an expression
        that returns them as a tuple, in the spec's order; each gets its own upstream
        gradient (:meth:`ops.spec.OpSpec.upstream_of`). ``dynamic_rows``: through the graph
        with N dynamic (see the class)."""
        from gate_residual_matrix import ops
        spec = ops.get(self.op)
        upstream = spec.upstream_of()
        names = [k for k in spec.inputs if k not in upstream.values()]
        index = {spec.index: inputs[spec.index]} if spec.index else {}
        fn = self._fn(emulate, dynamic_rows)

        def outputs(values) -> dict[str, torch.Tensor]:
            values = values if isinstance(values, tuple) else (values,)
            return dict(zip(spec.forwards, values, strict=True))

        with settings(emulate):
            if not backward:
                with torch.no_grad():
                    args = {**{k: inputs[k] for k in names}, **index}
                    return outputs(fn(*self._marked(args, spec, dynamic_rows).values()))
            leaves = {k: inputs[k].detach().requires_grad_() for k in names}
            args = self._marked({**leaves, **index}, spec, dynamic_rows)
            out = outputs(fn(*args.values()))
            torch.autograd.backward([out[k] for k in upstream],
                                    [inputs[g] for g in upstream.values()])
        return {**{k: v.detach() for k, v in out.items()},
                **{k: leaves[o.grad_of].grad for k, o in spec.outputs.items() if o.grad_of}}

    @staticmethod
    def _marked(args: dict, spec, dynamic_rows: bool) -> dict:
        """``args``, with dimension 0 of the row inputs marked dynamic for ``dynamic_rows``
        where N >= 2 (``mark_dynamic`` refuses sizes 0 and 1, which dynamo specialises). The
        marks go on aliases (``detach``), so the caller's tensors stay unmarked."""
        if not dynamic_rows:
            return args
        marked = dict(args)
        for k in spec.row_inputs():
            if k in marked and marked[k].shape[0] >= 2:
                alias = marked[k] if marked[k].requires_grad else marked[k].detach()
                torch._dynamo.mark_dynamic(alias, 0)
                marked[k] = alias
        return marked


def _own_code(fn):
    """A function like ``fn`` over a copy of its code object: dynamo's graphs of one are
    never the other's."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__,
                              fn.__defaults__, fn.__closure__)


def compiled_rows(op: str, expression, expression_emulate, source: str) -> tuple:
    """``(compiled, compiled_emulate)``: an op's two ``torch.compile`` rows, over
    ``expression`` and its second code object ``expression_emulate`` (the emulate row compiles
    under ``emulate_precision_casts``), as :class:`Compiled` calls them; ``source`` says what
    ``expression`` is. Both are unavailable without a compiler on PATH
    (:func:`missing_compiler`) and compile per shape (:mod:`runner.cell.precompile`); their
    ``run_dynamic`` goes through the graph with N dynamic (:class:`Compiled`)."""
    from gate_residual_matrix.contract.base import Implementation

    calls = Compiled(op, expression, expression_emulate)

    def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
        return calls.run(inputs, backward=backward, emulate=False)

    def run_emulate(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
        return calls.run(inputs, backward=backward, emulate=True)

    def run_dynamic(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
        return calls.run(inputs, backward=backward, emulate=False, dynamic_rows=True)

    def run_emulate_dynamic(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
        return calls.run(inputs, backward=backward, emulate=True, dynamic_rows=True)

    def where(fn) -> str:
        return f"{fn.__module__}.{fn.__qualname__}"

    return (
        Implementation(name="compiled", has_backward=True, run=run,
                       source=f"torch.compile({source}), inductor defaults, dynamic=False",
                       code_path=f"torch.compile({where(expression)}, dynamic=False)",
                       prerequisite=missing_compiler, compiles_per_shape=True,
                       run_dynamic=run_dynamic),
        Implementation(name="compiled_emulate", has_backward=True, run=run_emulate,
                       source="as compiled, with torch._inductor.config."
                              "emulate_precision_casts = True",
                       code_path=(f"torch.compile({where(expression_emulate)}, dynamic=False) "
                                  "under inductor emulate_precision_casts=True"),
                       prerequisite=missing_compiler, compiles_per_shape=True,
                       run_dynamic=run_emulate_dynamic),
    )
