"""The registry of implementations a cell runs and compares.

An implementation is a name, a ``source`` string (as in the reference report), whether it
has a backward, and a callable. Adding one is one small module here that defines an
:class:`Implementation` and one line in :data:`REGISTRY`.

Calling convention: ``impl.run(inputs, backward=...)`` where ``inputs`` maps ``residual``,
``gate``, ``y``, ``index``, ``grad_out`` to tensors already on the cell's target device
(the runner clones them for every call). It returns ``{"out": (N, D)}`` and, with
``backward=True`` and ``has_backward``, also ``"res"``, ``"y"``, ``"gate"``: the gradients
of residual, y and gate for the upstream gradient ``grad_out``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

Tensors = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Implementation:
    """One implementation of gate_residual.

    ``targets``: the cell targets it runs on ("cuda", "cpu"). ``role``: "candidate", or
    "accuracy_reference" (compared for error, never bitwise). ``bitwise_claims``: tensors
    it promises to be bitwise equal to the baseline on; a broken claim makes the cell
    status ``mismatch``. ``device``: where it computes, when that is fixed (fp64: "cpu").
    """

    name: str
    source: str
    has_backward: bool
    run: Callable[..., dict[str, torch.Tensor]]
    targets: tuple[str, ...] = ("cuda", "cpu")
    role: str = "candidate"
    bitwise_claims: tuple[str, ...] = ()
    device: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def unavailable_reason(self, target: str) -> str | None:
        """Why it cannot run on ``target`` here, or None when it can."""
        if target not in self.targets:
            return f"{self.name} does not run on target {target!r}"
        return None


def _registry() -> dict[str, Implementation]:
    """Every implementation; ``fault`` (faulty.py, test-only) when GATE_RESIDUAL_FAULTS=1."""
    from runner.implementations import eager, fp64, numba_kernel

    impls = [eager.EAGER, numba_kernel.NUMBA, fp64.FP64]
    if os.environ.get("GATE_RESIDUAL_FAULTS") == "1":
        from runner.implementations import faulty

        impls.append(faulty.FAULT)
    return {impl.name: impl for impl in impls}


REGISTRY: dict[str, Implementation] = _registry()

KNOWN = tuple(REGISTRY)


def get(name: str) -> Implementation:
    """The registered implementation called ``name``; ``KeyError`` lists the known names."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown implementation {name!r}; choose from {', '.join(KNOWN)}") from None
