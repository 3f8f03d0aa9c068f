"""Apply a mode in the cell process: what the environment held at start, torch settings.

A mode (matrix.yaml ``modes:``) is environment variables plus torch settings. The backend
puts the variables in the cell process's environment before Python starts
(:mod:`runner.backends.host`); :func:`snapshot` reads them back at the start of the ``cell``
command, before torch is imported, and :func:`apply_torch_settings` applies the torch
settings before any CUDA call. :func:`mode_environment` is what the report records under
``environment.mode_environment``: ``{mode: {VAR: value as the process saw it, ...,
"torch.<setting>": value applied}}``.

Example::

    >>> from gate_residual_matrix.runner.config.matrix import TorchSettings
    >>> apply_torch_settings(TorchSettings())
    {}
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class StartEnvironment:
    """``os.environ`` at the start of the cell command, and whether torch was loaded then."""

    environ: Mapping[str, str]
    torch_imported: bool


def snapshot() -> StartEnvironment:
    """The process environment now; call it before importing torch."""
    return StartEnvironment(dict(os.environ), "torch" in sys.modules)


def apply_torch_settings(settings) -> dict:
    """Apply a :class:`runner.config.matrix.TorchSettings`; return what was set, by its torch name.

    ``deterministic`` -> ``torch.use_deterministic_algorithms``; ``tf32`` ->
    ``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32``
    (neither creates a CUDA context); ``inference_mode`` is recorded here and applied by
    :func:`runner.cell.run.run_cell` around the forward-only runs. Unset (None) settings are
    left alone and not recorded.
    """
    import torch

    applied: dict = {}
    if settings.deterministic is not None:
        torch.use_deterministic_algorithms(settings.deterministic)
        applied["torch.use_deterministic_algorithms"] = settings.deterministic
    if settings.tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = settings.tf32
        torch.backends.cudnn.allow_tf32 = settings.tf32
        applied["torch.backends.cuda.matmul.allow_tf32"] = settings.tf32
        applied["torch.backends.cudnn.allow_tf32"] = settings.tf32
    if settings.inference_mode is not None:
        applied["torch.inference_mode"] = settings.inference_mode
    return applied


def mode_environment(name: str, mode, start: StartEnvironment | None,
                     applied: Mapping | None = None) -> dict:
    """``{name: {VAR: value, ..., torch setting: value}}`` for the report.

    With ``start`` (the cell command), each of the mode's variables is recorded as the
    process saw it before torch was imported (None when it was absent: the backend did not
    set it); without (an in-process run), as the mode declares it.
    """
    env = {k: (start.environ.get(k) if start else v) for k, v in mode.env.items()}
    return {name: {**env, **dict(applied or {})}}
