"""The catalog: each op's implementations by name (``ops/<op>/implementations.py``), and
the rows a matrix runs (its implementations, library ones per version: :func:`rows`)."""

from __future__ import annotations

import importlib

import gate_residual_matrix.contract.versioned as versioned
from gate_residual_matrix import ops
from gate_residual_matrix.contract.base import Implementation
from gate_residual_matrix.contract.library import LibraryImplementation

_REGISTRIES: dict[str, dict[str, Implementation]] = {}


def registry(op: str) -> dict[str, Implementation]:
    """Every implementation of ``op`` by name (its ``IMPLEMENTATIONS``, imported on first
    use and kept: the dict is the registry, tests may patch it)."""
    if op not in _REGISTRIES:
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
    op = op or ops.OPS[0]
    table = registry(op)
    try:
        return table[name]
    except KeyError:
        found = lookup(name, op)  # "<library impl>-<version>"
        if found is not None:
            return found
        raise KeyError(f"unknown implementation {name!r} of {op}; choose from "
                       f"{', '.join(table)}") from None


def rows(matrix) -> list[Implementation]:
    """The implementation rows of ``matrix``: its ``implementations`` in order, each library
    one whose distribution ``libraries.versions`` names expanded into one row per version,
    and ``rl_kernel_h3`` bound to its tree; unchanged without a ``libraries`` section."""
    op = getattr(matrix, "op", None)
    libraries = getattr(matrix, "libraries", None)
    out: list[Implementation] = []
    for name in matrix.implementations:
        impl = get(name, op)
        if libraries is not None and isinstance(impl, LibraryImplementation):
            versions = libraries.versions.get(impl.distribution)
            if versions:
                out.extend(versioned.versioned(impl, v, libraries.wheelhouse)
                           for v in versions)
                continue
            if impl.distribution == "RL-Kernel":
                out.append(versioned.on_tree(impl, libraries.rl_kernel))
                continue
        out.append(impl)
    return out


def lookup(name: str, op: str) -> Implementation | None:
    """A versioned row of ``op`` by name (``<library implementation>-<version>``) with the
    default wheelhouse, or None when ``name`` is not one."""
    base, sep, version = name.rpartition("-")
    impl = registry(op).get(base)
    if not sep or not isinstance(impl, LibraryImplementation) or impl.distribution == "RL-Kernel":
        return None
    return versioned.versioned(impl, version)
