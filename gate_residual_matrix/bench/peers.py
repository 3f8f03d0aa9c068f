"""The implementations ``bench.gate_residual`` times side by side, each through its public
function.

A :class:`Peer` is a name, what it runs (the code path, as a report records it), a forward
``forward(r, g, y, i) -> out`` and, where it has one, a differentiable ``op(r, g, y, i) ->
out`` whose backward autograd runs; or the one-line reason it cannot run here. The bench
calls every peer with the same harness (:func:`contract.timing.median_ms`).

* ``eager``: ``residual + gate.index_select(0, index) * y``.
* ``compiled``: ``torch.compile`` of the same expression as the matrix's ``compiled`` row
  (:mod:`ops.gate_residual.compiled`: ``dynamic=False``, its dynamo settings); one compiled
  function per (dtype, N, forward or forward+backward), so no case recompiles another's.
* ``numba``: ours, :func:`kernels.gate_residual.gate_residual_forward` and
  :func:`kernels.gate_residual.gate_residual` (the CPU twin on the CPU).
* ``rl_kernel_h3``: RL-Kernel's ``H3GateResidualCudaOp`` from the source tree the matrix
  resolves (:mod:`contract.rl_kernel_tree`: ``$GATE_RESIDUAL_RL_KERNEL``,
  ``.carry/rl-kernel-h3``, ``../shared/third_party/rl-kernel-h3``); its extension is built on
  first import.
* library rows ``<impl>-<version>`` (default :data:`LIBRARIES`): the library's own function,
  installed or kernel-only from the kernel wheelhouse (:mod:`contract.versioned`), called
  directly: the runner's code-path watch is left out, so its cost is not
  charged to the library. Forward only.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

#: The library rows timed by default: the newest versions in matrix.yaml of the two library
#: kernels of the op itself (SGLang's ``indexed_gate_bf16``, vllm-omni's ``indexed_gate``).
LIBRARIES = ("sglang_indexed_gate_triton-0.5.23", "vllm_omni_gated_residual-0.30.0")


@dataclass
class Peer:
    """One implementation as the bench calls it (see the module docstring).

    ``dtypes``: storage dtypes it takes (None: all). ``context``: entered around all of its
    timed calls (a kernel-only library's modules in ``sys.modules``). ``unavailable``: why it
    cannot run here (then ``forward`` is None).
    """

    name: str
    ran: str
    forward: Callable | None = None
    op: Callable | None = None
    dtypes: tuple[str, ...] | None = None
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    unavailable: str | None = None
    per_case: Callable[[str, int, bool], Callable] | None = field(default=None, repr=False)

    def takes(self, dtype: str) -> bool:
        """Whether it runs ``dtype`` rows."""
        return self.dtypes is None or dtype in self.dtypes


def _eager(r, g, y, i):
    return r + g.index_select(0, i) * y


def eager_peer() -> Peer:
    return Peer("eager", "torch: residual + gate.index_select(0, index) * y", _eager, _eager)


def numba_peer(device: str) -> Peer:
    """Ours: the public entry points (the CPU twin on the CPU)."""
    if device == "cuda":
        from gate_residual_matrix.kernels.gate_residual import gate_residual, gate_residual_forward

        return Peer("numba", "kernels.gate_residual: gate_residual_forward / gate_residual",
                    gate_residual_forward, gate_residual)
    from gate_residual_matrix.kernels.gate_residual_cpu import GateResidualCPU, gate_residual_cpu

    return Peer("numba", "kernels.gate_residual_cpu: gate_residual_cpu / GateResidualCPU",
                gate_residual_cpu, GateResidualCPU.apply)


def compiled_peer(device: str) -> Peer:
    """``torch.compile`` of the matrix's expression; one compiled function per case and
    mode (``per_case(dtype, n, backward)``), built at the case's first call."""
    from gate_residual_matrix.ops.gate_residual.compiled import expression, missing_compiler
    from gate_residual_matrix.ops.torch_compile import settings

    why = missing_compiler(device)
    if why:
        return Peer("compiled", "torch.compile (inductor)", unavailable=why)
    made: dict[tuple, Callable] = {}

    def per_case(dtype: str, n: int, backward: bool) -> Callable:
        key = (dtype, n, backward)
        if key not in made:
            # a fresh code object per case: dynamo's cache is per code object
            code = expression.__code__.replace()
            fresh = types.FunctionType(code, expression.__globals__, f"expression_{len(made)}")
            made[key] = torch.compile(fresh, dynamic=False)
        return made[key]

    return Peer("compiled", "torch.compile(ops.gate_residual.compiled.expression, "
                "dynamic=False), inductor defaults", per_case=per_case,
                context=lambda: settings(False))


def rl_kernel_peer(device: str) -> Peer:
    """RL-Kernel's op on the source tree the matrix would use (built on first import)."""
    from gate_residual_matrix.contract.library import LibraryImplementation
    from gate_residual_matrix.contract.versioned import on_tree
    from gate_residual_matrix.runner.cell.catalog import get

    row = get("rl_kernel_h3")
    if not isinstance(row, LibraryImplementation):  # pragma: no cover - the registry's
        raise TypeError(f"rl_kernel_h3 is a {type(row).__name__}, not a library row")
    impl = on_tree(row)
    why = impl.unavailable_reason(device)
    if why:
        return Peer("rl_kernel_h3", " | ".join(impl.entries), unavailable=why)
    _, op_class = impl.entry()
    op = op_class()

    def call(r, g, y, i):
        return op(r, y, g, i)

    return Peer("rl_kernel_h3", impl.ran(), call, call)


def library_peer(name: str, device: str) -> Peer:
    """A library row ``<impl>-<version>``: its function, called directly (forward only)."""
    from gate_residual_matrix.contract.library import LibraryImplementation
    from gate_residual_matrix.contract.versioned import _USED
    from gate_residual_matrix.runner.cell.catalog import get

    try:
        impl = get(name)
    except KeyError as err:
        return Peer(name, name, unavailable=str(err).strip("'\""))
    if not isinstance(impl, LibraryImplementation):
        return Peer(name, name, unavailable=f"{name} is not a library row")
    why = impl.unavailable_reason(device)
    if why:
        return Peer(name, " | ".join(impl.entries), unavailable=why)
    _, fn = impl.entry()
    installed = getattr(impl, "installed", lambda: True)()
    context = contextlib.nullcontext if installed else _USED[impl.name].active
    return Peer(name, impl.ran(), fn, None, dtypes=impl.dtypes, context=context)


def peers(device: str, *, with_compile: bool, libraries=LIBRARIES,
          only: list[str] | None = None) -> list[Peer]:
    """The peers in table order: eager, compiled, ours, RL-Kernel, the library rows.
    ``only``: the names to make (the others are not even imported: RL-Kernel's builds its
    extension on import); None: all."""
    makers: list[tuple[str, Callable[[], Peer]]] = [("eager", eager_peer)]
    if with_compile:
        makers.append(("compiled", lambda: compiled_peer(device)))
    makers += [("numba", lambda: numba_peer(device)),
               ("rl_kernel_h3", lambda: rl_kernel_peer(device))]
    makers += [(name, functools.partial(library_peer, name, device)) for name in libraries]
    return [make() for name, make in makers if only is None or name in only]


__all__ = ["LIBRARIES", "Peer", "compiled_peer", "eager_peer", "library_peer", "numba_peer",
           "peers", "rl_kernel_peer"]
