"""The ops this project runs: one folder each, listed once in :data:`OPS`.

An op is a unit: ``ops/<name>/__init__.py`` holds its :class:`~ops.spec.OpSpec`
(problem sizes, tensors and labels, the bandwidth formula), ``ops/<name>/implementations.py``
its implementations (eager, fp64, ours, compiled, library rows). Its kernels sit in
``kernels/`` (CUDA and CPU twins). The runner (``runner/``) reads the spec and names no op.

Example::

    >>> from gate_residual_matrix import ops
    >>> ops.OPS
    ('gate_residual', 'indexed_scale_shift', 'rms_norm', 'add_rms_norm', 'rms_norm_scale_shift')
    >>> ops.get("indexed_scale_shift").grads
    ('x', 'scale', 'shift')
"""

from __future__ import annotations

import importlib

from gate_residual_matrix.ops.spec import OpSpec

OPS: tuple[str, ...] = ("gate_residual", "indexed_scale_shift", "rms_norm", "add_rms_norm",
                         "rms_norm_scale_shift")
"""Every op, in the order the tables list them. The first is the op of reports made before
ops existed (schema version 1 reports carry no tensor names; they are upgraded with its)."""

__all__ = ["OPS", "OpSpec", "get"]


def get(name: str) -> OpSpec:
    """The spec of op ``name``; ``KeyError`` lists the known ops."""
    if name not in OPS:
        raise KeyError(f"unknown op {name!r}; choose from {', '.join(OPS)}")
    return importlib.import_module(f"gate_residual_matrix.ops.{name}").SPEC
