"""Errors raised by the kernels' entry points; no dependency on the runner.

``kernels/`` is a library the runner calls, not a part of it: it must import without
``runner``. The runner re-exports :class:`OpInputError` as
``runner.errors.OpInputError``, so ``except runner.errors.OpInputError`` and
``except ValueError`` both catch what the kernels raise.

Example::

    >>> raise OpInputError("gate_residual: index must be int64 or int32, got torch.float32")
    Traceback (most recent call last):
    ...
    kernels.errors.OpInputError: gate_residual: index must be int64 or int32, got torch.float32
"""

from __future__ import annotations


class OpInputError(ValueError):
    """Bad input to an op's entry point (shape, dtype, device, layout or index range); the
    message is one line and starts with the op's name, e.g. ``indexed_scale_shift: ...``."""


__all__ = ["OpInputError"]
