"""What an implementation is: :class:`Implementation` (the op contract: :mod:`contract`)."""

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
    (torch.compile with static shapes), so :mod:`runner.cell.precompile` may build them ahead.
    ``cached_kernels``: the targets on which it compiles its kernels once per dtype pair
    into an on-disk cache (our numba.cuda kernels: kernels/cubin_cache.py), so
    :mod:`runner.cell.precompile` runs it once per dtype pair and case size ahead of the cells.
    ``run_dynamic``: for an implementation that compiles per shape, the same computation
    through one graph with the row dimension dynamic (N = 1 aside), called as ``run`` is; the
    batch-invariance checks call it (:mod:`runner.cell.batch_invariance`), every other call
    (the cases' runs, timings) calls ``run``.
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
    cached_kernels: tuple[str, ...] = ()
    run_dynamic: Callable[..., dict[str, torch.Tensor]] | None = None

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
