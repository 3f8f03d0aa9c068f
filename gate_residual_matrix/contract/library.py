"""How a library implementation is called: the library's own function, imported by its exact
path, with the code path that ran recorded and checked. Never a re-implementation.

A :class:`LibraryImplementation` names the function it calls as ``"module:function"``
candidates (a library that moved the function between versions has several, newest layout
first), the distribution whose installed version the report records, and, where the function
dispatches to one of several internal backends (SGLang's ``residual_gate_add_cuda`` ran Triton
in 0.5.21 and JIT CUDA from 0.5.22), the module-level functions it may dispatch to.

- :meth:`~LibraryImplementation.unavailable_reason`: the target, then each candidate in
  order; when none imports, every failed import is named, e.g. ``import vllm_omni.diffusion.
  layers.indexed_modulation failed: ModuleNotFoundError: No module named 'vllm_omni'; ...``.
- :meth:`~LibraryImplementation.ran`: built from the function object imported
  (``fn.__module__:fn.__qualname__``), the backend this version dispatches to and the
  installed version, e.g. ``sglang.kernels.kda_kernels.residual_gate_add_jit:
  residual_gate_add_cuda -> _residual_gate_add_cuda_impl (JIT CUDA ...) [sglang 0.5.23]``.
  Where nothing imports, the candidate paths, joined by `` | ``.
- :meth:`~LibraryImplementation.call`: calls the function with the backends watched
  (:func:`watching`), and raises :class:`CodePathChanged` when a backend other than the one
  :meth:`ran` reports ran, so a report never records a path that did not run.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType

from gate_residual_matrix.contract.base import Implementation

#: Backends seen by :meth:`LibraryImplementation.call` in this process, by implementation name.
OBSERVED: dict[str, str] = {}


class LibraryMissing(ImportError):
    """No candidate of a library implementation imports; the message names every failure."""


class CodePathChanged(RuntimeError):
    """A library call ran another internal backend than the one the report records."""


def _one_line(err: BaseException) -> str:
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def installed_version(distribution: str) -> str:
    """The installed version of ``distribution`` (pip name), or ``"version unknown"``."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "version unknown"


def attribute(module: ModuleType, path: str):
    """``module``'s attribute at the dotted ``path`` (``"Cls.apply"``), or None."""
    value = module
    for part in path.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


@contextlib.contextmanager
def watching(module: ModuleType, names: tuple[str, ...]) -> Iterator[list[str]]:
    """Replace ``module``'s functions ``names`` by wrappers that append their name to the
    yielded list, then call the original; restored on exit. Names the module lacks are
    skipped. Library code that looks the function up as a module global at call time (all
    the dispatchers wired here do) goes through the wrapper."""
    seen: list[str] = []
    saved = {name: module.__dict__[name] for name in names
             if callable(module.__dict__.get(name))}

    def wrap(name: str, original: Callable) -> Callable:
        def spy(*args, **kwargs):
            seen.append(name)
            return original(*args, **kwargs)
        return spy

    for name, original in saved.items():
        setattr(module, name, wrap(name, original))
    try:
        yield seen
    finally:
        for name, original in saved.items():
            setattr(module, name, original)


@dataclass(frozen=True)
class LibraryImplementation(Implementation):
    """An :class:`Implementation` that calls a library's function (see the module docstring).

    ``distribution``: the pip name whose version :meth:`ran` records ("sglang"). ``entries``:
    ``"module:function"`` candidates, newest layout first. ``watch``: ``(name, label)`` of the
    module-level functions the entry may dispatch to, watched on every :meth:`call`.
    ``backend(module)``: what this version runs for our layout: one of ``watch``'s names
    (checked on every call), or a free description (not checked), or None when unknown.
    ``check(module)``: why the library cannot run although it imports (an extension that
    was not built), or None. ``dtypes``: the storage dtypes the library function takes (None:
    every dtype), for a cell runner that skips other cases; :meth:`refuse_dtype` raises.
    ``tree_entries``: the ``"module:function"`` candidates inside a source tree (RL-Kernel's
    layouts), which a row bound to a tree tries instead of ``entries`` (versioned.on_tree).
    A function may be an attribute path (``"module:LigerRMSNormFunction.apply"``).
    """

    distribution: str = ""
    entries: tuple[str, ...] = ()
    watch: tuple[tuple[str, str], ...] = ()
    backend: Callable[[ModuleType], str | None] | None = None
    check: Callable[[ModuleType], str | None] | None = None
    dtypes: tuple[str, ...] | None = None
    tree_entries: tuple[str, ...] = ()

    def entry(self) -> tuple[ModuleType, Callable]:
        """``(module, function)`` of the first candidate that imports and has the function;
        :class:`LibraryMissing` naming every failure otherwise."""
        failures = []
        for candidate in self.entries:
            module_name, _, attr = candidate.partition(":")
            try:
                module = importlib.import_module(module_name)
            except Exception as err:  # ImportError, or a package that fails as it loads
                failures.append(f"import {module_name} failed: {_one_line(err)}")
                continue
            fn = attribute(module, attr)
            if fn is None:
                failures.append(f"{module_name} has no {attr!r}")
                continue
            return module, fn
        raise LibraryMissing("; ".join(failures) or f"{self.name}: no entry point declared")

    def unavailable_reason(self, target: str) -> str | None:
        """Why it cannot run on ``target`` here: the target, then the base class's
        ``requires``, then the candidates (every failed import named), then ``check``."""
        why = super().unavailable_reason(target)
        if why:
            return why
        try:
            module, _ = self.entry()
        except LibraryMissing as err:
            return str(err)
        return self.check(module) if self.check else None

    def _expected(self, module: ModuleType) -> str | None:
        return self.backend(module) if self.backend else None

    def ran(self) -> str:
        """``module:function -> backend (label) [distribution version]`` of what a call runs
        here (the backend a call observed, else the one this version dispatches to); the
        candidate paths when none imports."""
        try:
            module, fn = self.entry()
        except LibraryMissing:
            return " | ".join(self.entries)
        owner = getattr(fn, "__self__", None)  # a classmethod (Function.apply): its class
        if isinstance(owner, type):
            path = f"{owner.__module__}:{owner.__qualname__}.{fn.__name__}"
        else:
            path = (f"{getattr(fn, '__module__', module.__name__)}:"
                    f"{getattr(fn, '__qualname__', self.entries[0].partition(':')[2])}")
        backend = OBSERVED.get(self.name) or self._expected(module)
        labels = dict(self.watch)
        if backend in labels:
            path += f" -> {backend} ({labels[backend]})"
        elif backend:
            path += f" -> {backend}"
        elif self.watch:
            path += " -> backend not identified for this version"
        return f"{path} [{self.distribution} {installed_version(self.distribution)}]"

    def refuse_dtype(self, rows) -> None:
        """``TypeError`` when ``rows``' dtype is not one of ``dtypes``, before any library call."""
        name = str(rows.dtype).removeprefix("torch.")
        if self.dtypes is not None and name not in self.dtypes:
            raise TypeError(f"{self.entries[0]} takes {', '.join(self.dtypes)} rows only, "
                            f"got {name}")

    def call(self, *args, **kwargs):
        """Call the library function with ``args``, its backends watched; return its result.

        Raises :class:`CodePathChanged` when the backends that ran are not exactly the one
        :meth:`ran` reports (``backend(module)``), e.g. a new version that dispatches our
        layout elsewhere; and :class:`LibraryMissing` when nothing imports.
        """
        module, fn = self.entry()
        names = tuple(name for name, _ in self.watch)
        with watching(module, names) as seen:
            result = fn(*args, **kwargs)
        if names:
            ran = list(dict.fromkeys(seen))
            expected = self._expected(module)
            if expected in dict(self.watch) and ran != [expected]:
                called = f"{module.__name__}:{getattr(fn, '__qualname__', fn)}"
                raise CodePathChanged(
                    f"{called} ran {', '.join(ran) or 'none of ' + ', '.join(names)}, "
                    f"but the report records {expected}")
            if len(ran) == 1:
                OBSERVED[self.name] = ran[0]
        return result
