"""Library versions as a matrix dimension: one implementation row per (library
implementation, version), and the RL-Kernel row bound to a source tree.

matrix.yaml's ``libraries`` section (:class:`runner.config.matrix.Libraries`) names the versions per
distribution; :func:`runner.cell.catalog.rows` turns each library implementation
of the matrix whose distribution is named there into rows ``<name>-<version>``
(``sglang_indexed_gate_triton-0.5.23``: the report schema's name pattern), each a
:class:`VersionedImplementation`:

* where that exact version is installed, the library is imported normally, and the code path
  says ``installed, normal import``;
* otherwise its modules are loaded **kernel-only** from the kernel wheelhouse
  (:mod:`contract.kernel_only`), and the code path names the wheel, its sha256,
  every file loaded with its sha256, any substitute, and the torch and triton that ran it.
  A version without the module is ``unavailable``: ``<module>: not in this version (<dist>
  <version>)``.

``rl_kernel_h3`` becomes a :class:`TreeImplementation` on the tree that
:func:`contract.rl_kernel_tree.resolve` picks.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import gate_residual_matrix.contract.kernel_only as kernel_only
import gate_residual_matrix.contract.rl_kernel_tree as rl_kernel_tree
from gate_residual_matrix.contract.library import (
    LibraryImplementation,
    LibraryMissing,
    attribute,
    installed_version,
)
from gate_residual_matrix.contract.wheel_record import resolve_root

KERNEL_ONLY_MARK = "kernel-only"
_USED: dict[str, kernel_only.Loaded] = {}  # row name -> the version it loaded, once loaded


def runtime() -> str:
    """``torch X, triton Y``: what actually runs a library kernel here."""
    import torch

    try:
        import triton

        triton_version = getattr(triton, "__version__", None) or "version unknown"
    except ImportError:
        triton_version = "not installed"
    return f"torch {torch.__version__}, triton {triton_version}"


@dataclass(frozen=True)
class VersionedImplementation(LibraryImplementation):
    """A library implementation pinned to one ``version`` of its distribution, imported
    normally where that version is installed, else kernel-only from ``wheelhouse``."""

    version: str = ""
    wheelhouse: str = ""

    def installed(self) -> bool:
        """Whether this exact version of the distribution is installed (normal import)."""
        return installed_version(self.distribution) == self.version

    def entry(self) -> tuple[ModuleType, Callable[..., Any]]:
        """``(module, function)``: the normal import when :meth:`installed`, else the first
        candidate that loads kernel-only; :class:`LibraryMissing` naming every failure."""
        if self.installed():
            return super().entry()
        failures = []
        for candidate in self.entries:
            module_name, _, attr = candidate.partition(":")
            try:
                loaded, module = kernel_only.load(Path(self.wheelhouse), self.distribution,
                                                  self.version, module_name)
            except kernel_only.KernelOnlyError as err:
                failures.append(str(err))
                continue
            fn = attribute(module, attr)
            if not callable(fn):
                failures.append(f"{module_name} ({self.distribution} {self.version}) has no "
                                f"{attr!r}")
                continue
            _USED[self.name] = loaded
            return module, fn
        raise LibraryMissing("; ".join(dict.fromkeys(failures)))

    def ran(self) -> str:
        """The library's code path, then ``[<dist> <version> installed, normal import; torch
        X, triton Y]`` or ``[kernel-only <dist> <version>, wheel W sha256 H; files: ...;
        torch X, triton Y]``; the candidates and the version where nothing loads."""
        path = super().ran()
        try:
            self.entry()
        except LibraryMissing:
            return f"{path} [{self.distribution} {self.version}: not loaded]"
        path = path.rsplit(" [", 1)[0]
        if self.installed():
            return (f"{path} [{self.distribution} {self.version} installed, normal import; "
                    f"{runtime()}]")
        return f"{path} [{_USED[self.name].describe()}; {runtime()}]"

    def record(self) -> dict | None:
        """JSON for the report's environment: how this row's library was loaded, or None."""
        try:
            self.entry()
        except LibraryMissing:
            return None
        if self.installed():
            return {"mode": "installed", "distribution": self.distribution,
                    "version": self.version, "runtime": runtime()}
        return {**_USED[self.name].record(), "runtime": runtime()}

    def call(self, *args, **kwargs):
        """The library call (see :meth:`LibraryImplementation.call`); kernel-only, with this
        version's modules in ``sys.modules`` while it runs."""
        if self.installed():
            return super().call(*args, **kwargs)
        self.entry()
        touched = len(kernel_only.TOUCHED)
        with _USED[self.name].active():
            result = super().call(*args, **kwargs)
        if len(kernel_only.TOUCHED) > touched:  # the library caught a StandInTouched
            raise kernel_only.StandInTouched(
                f"{self.name} used the kernel-only stand-in(s) "
                f"{', '.join(kernel_only.TOUCHED[touched:])}: the recorded path did not run")
        return result


@dataclass(frozen=True)
class TreeImplementation(LibraryImplementation):
    """``rl_kernel_h3`` on an RL-Kernel source ``tree`` (both module paths RL-Kernel used)."""

    tree: str = ""

    def unavailable_reason(self, target: str) -> str | None:
        """The target, then the tree's :func:`rl_kernel_tree.problem` (bad path, CPU torch,
        no nvcc), then the import and the built extension; one line each."""
        if target not in self.targets:
            return f"{self.name} does not run on target {target!r}"
        why = rl_kernel_tree.problem(Path(self.tree), self.modules())
        return why or super().unavailable_reason(target)

    def modules(self) -> tuple[str, ...]:
        """The modules of ``entries`` (the tree's candidates)."""
        return tuple(e.partition(":")[0] for e in self.entries)

    def entry(self):
        """Import the op from the tree (put first on ``sys.path``); :class:`LibraryMissing`
        when the import fails or ``rl_engine`` came from elsewhere."""
        tree = Path(self.tree)
        rl_kernel_tree.prepare(tree)
        module, fn = super().entry()
        elsewhere = rl_kernel_tree.imported_from(module, tree)
        if elsewhere:
            raise LibraryMissing(elsewhere)
        return module, fn

    def ran(self) -> str:
        """The op's path and kernel ids, then ``[RL-Kernel tree T, PROVENANCE.json sha256 H;
        torch X]`` (or the checkout's commit)."""
        tree = Path(self.tree)
        if rl_kernel_tree.problem(tree, self.modules()):
            path = " | ".join(self.entries)
        else:
            path = super().ran().rsplit(" [", 1)[0]
        return f"{path} [RL-Kernel {rl_kernel_tree.provenance(tree)}; {runtime()}]"

    def record(self) -> dict:
        """JSON for the report's environment: the tree and its provenance."""
        return {"mode": "source tree", "distribution": self.distribution,
                "tree": rl_kernel_tree.provenance(Path(self.tree)), "runtime": runtime()}


_Row = TypeVar("_Row", bound=LibraryImplementation)


def _bound(impl: _Row) -> _Row:
    """``impl`` whose ``run`` calls through ``impl`` itself (the ops' ``impl=`` argument)."""
    base_run = impl.run.func if isinstance(impl.run, functools.partial) else impl.run
    object.__setattr__(impl, "run", functools.partial(base_run, impl=impl))
    return impl


def versioned(impl: LibraryImplementation, version: str,
              wheelhouse: str | Path | None = None) -> VersionedImplementation:
    """The row ``<impl.name>-<version>`` of ``impl`` (see the module docstring)."""
    fields = {f.name: getattr(impl, f.name) for f in dataclasses.fields(impl)}
    fields.update(name=f"{impl.name}-{version}", version=version,
                  wheelhouse=str(resolve_root(wheelhouse)),
                  source=f"{impl.source}; version {version} ({KERNEL_ONLY_MARK} where not "
                         "installed)")
    # a row that is already a versioned kind (contract.extension) keeps it
    kind = type(impl) if isinstance(impl, VersionedImplementation) else VersionedImplementation
    return _bound(kind(**fields))


def on_tree(impl: LibraryImplementation, tree: str | Path | None = None) -> TreeImplementation:
    """``impl`` (an RL-Kernel row) bound to the RL-Kernel tree :func:`rl_kernel_tree.resolve`
    picks for ``tree``; its ``tree_entries`` (every layout RL-Kernel used) are the
    candidates."""
    fields = {f.name: getattr(impl, f.name) for f in dataclasses.fields(impl)}
    fields.update(tree=str(rl_kernel_tree.resolve(tree)),
                  entries=impl.tree_entries or impl.entries)
    return _bound(TreeImplementation(**fields))


def environment_record(impls) -> dict:
    """``{row name: record}`` of the kernel-only / installed / tree rows among ``impls``."""
    out = {}
    for impl in impls:
        if isinstance(impl, (VersionedImplementation, TreeImplementation)):
            rec = impl.record()
            if rec is not None:
                out[impl.name] = rec
    return out
