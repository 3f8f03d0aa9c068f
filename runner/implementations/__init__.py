"""What an implementation is, and the registry of each op's implementations.

An implementation is a name, a ``source`` string (as in the reference report), whether it
has a backward, and a callable. An op's implementations live in its folder
(``ops/<op>/implementations.py``, ``IMPLEMENTATIONS``); adding one is one small module
there that defines an :class:`Implementation` and one entry in that tuple (and its name in
the spec's ``implementation_names``).

Calling convention: ``impl.run(inputs, backward=...)`` where ``inputs`` maps the op's input
names (:attr:`ops.spec.OpSpec.inputs` and its ``index``) to tensors already on the cell's
target device (the runner clones them for every call and checks that no input changed: see
:mod:`runner.cell`). It returns the forward output (:attr:`ops.spec.OpSpec.forward`) and,
with ``backward=True`` and ``has_backward``, the gradients (:attr:`ops.spec.OpSpec.grads`)
for the upstream gradient (:attr:`ops.spec.OpSpec.upstream`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

Tensors = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Implementation:
    """One implementation of an op.

    ``targets``: the cell targets it runs on ("cuda", "cpu"). ``role``: "candidate", or
    "accuracy_reference" (compared for error, never bitwise). ``bitwise_claims``: tensors
    it promises to be bitwise equal to the baseline on; a broken claim makes the cell
    status ``mismatch``. ``device``: where it computes, when that is fixed (None: the
    cell's device).
    ``requires``: modules imported to decide availability (a library's); ``code_path``:
    what a call runs, as the report records it (default: ``run``'s module and name);
    ``not_wired``: the reason it is unavailable even when ``requires`` import (a library
    whose entry point this runner does not call yet). ``prerequisite(target)``: what else
    this environment lacks for it on ``target`` (e.g. a compiler), or None.
    ``compiles_per_shape``: it compiles one program per input shape into an on-disk cache
    (torch.compile with static shapes), so :mod:`runner.precompile` may build them ahead.
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
    requires: tuple[str, ...] = ()
    code_path: str | None = None
    not_wired: str | None = None
    prerequisite: Callable[[str], str | None] | None = None
    compiles_per_shape: bool = False

    def unavailable_reason(self, target: str) -> str | None:
        """Why it cannot run on ``target`` here, or None when it can.

        Checks the target, then imports every module named in ``requires`` (in order); the
        first that fails is named with its error, e.g. ``import sglang.kernels.ops: ...
        ModuleNotFoundError: No module named 'sglang'``.
        """
        if target not in self.targets:
            return f"{self.name} does not run on target {target!r}"
        for module in self.requires:
            try:
                importlib.import_module(module)
            except Exception as err:  # ImportError, or a package that fails as it loads
                first = (str(err).strip().splitlines() or [""])[0]
                return f"import {module} failed: {type(err).__name__}: {first}"
        if self.prerequisite is not None and (missing := self.prerequisite(target)):
            return missing
        return self.not_wired

    def available(self, target: str) -> bool:
        """Whether it can run on ``target`` here (:meth:`unavailable_reason` is None)."""
        return self.unavailable_reason(target) is None

    def ran(self) -> str:
        """The code path a call runs: ``code_path`` when set, else ``module.function`` of
        ``run``."""
        return self.code_path or f"{self.run.__module__}.{self.run.__qualname__}"


_REGISTRIES: dict[str, dict[str, Implementation]] = {}


def registry(op: str) -> dict[str, Implementation]:
    """Every implementation of ``op`` by name (its ``IMPLEMENTATIONS``, imported on first
    use and kept: the dict is the registry, tests may patch it)."""
    if op not in _REGISTRIES:
        import ops

        module = importlib.import_module(ops.get(op).implementations_module)
        _REGISTRIES[op] = {impl.name: impl for impl in module.IMPLEMENTATIONS}
    return _REGISTRIES[op]


def known(op: str) -> tuple[str, ...]:
    """The names of ``op``'s implementations."""
    return tuple(registry(op))


def get(name: str, op: str | None = None) -> Implementation:
    """The implementation of ``op`` (default: the first of :data:`ops.OPS`) called ``name``,
    or a library version's row ``<name>-<version>`` (kernel-only from the default
    wheelhouse: versioned.py); ``KeyError`` lists the known names."""
    import ops

    op = op or ops.OPS[0]
    table = registry(op)
    try:
        return table[name]
    except KeyError:
        from runner.implementations.versioned import lookup  # "<library impl>-<version>"

        found = lookup(name, op)
        if found is not None:
            return found
        raise KeyError(f"unknown implementation {name!r} of {op}; choose from "
                       f"{', '.join(table)}") from None
