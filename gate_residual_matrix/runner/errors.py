"""Errors a user can meet, one class per kind, each with its exit code.

The command line (``runner.__main__``) catches :class:`MatrixError` in one place,
prints its one-line message and exits with ``exit_code``. Failures *inside a cell*
are not exceptions at this level: they become data (a report with a non-``ok``
status), so one failing cell never stops the matrix. A signal that stops the run
(SIGINT, SIGTERM) is :class:`Interrupted`, not a :class:`MatrixError`: like
``KeyboardInterrupt`` it passes every ``except Exception`` on its way out.
"""

from __future__ import annotations

import signal

# Bad input to an op (shape, dtype, device, index range): raised by kernels/, which must not
# import the runner, so the class lives there; a ValueError, not a MatrixError
# (an implementation's failure inside a cell is data, caught by runner/cell/case.py).
from gate_residual_matrix.kernels.errors import OpInputError as OpInputError


class MatrixError(Exception):
    """Base class of every error the runner reports to the user (exit code 1)."""

    exit_code = 1


class ConfigError(MatrixError):
    """matrix.yaml or a command-line option is invalid (exit code 2).

    The message names the key path, what was expected and what was found, e.g.
    ``matrix.yaml: cases[2].n: expected an integer >= 1, got 0``.
    """

    exit_code = 2


class SelectionError(ConfigError):
    """A selection (``--stack``, ``--mode``, ``--target``, ``--case``) matches nothing."""


class ReportError(MatrixError):
    """A report file is corrupt, truncated, of another schema or fails validation (exit 3)."""

    exit_code = 3




class BackendError(MatrixError):
    """A backend (host or docker) cannot run at all, e.g. no Docker engine answers (exit 4)."""

    exit_code = 4


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP reached the runner (exit code 128 + the signal: 130, 143,
    129).

    A ``KeyboardInterrupt``, so that every clean-up written for Ctrl-C (kill the cell's
    process group, remove its container and staging directory, remove a half-written
    temporary file) also runs for SIGTERM.

    Example::

        >>> Interrupted(signal.SIGTERM).exit_code
        143
    """

    def __init__(self, signum: int = signal.SIGINT) -> None:
        self.signum = int(signum)
        self.exit_code = 128 + self.signum
        super().__init__(self.signal_name)

    @property
    def signal_name(self) -> str:
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"


class ImageError(BackendError):
    """A docker stack's image cannot be rendered or built: a missing wheelhouse, CA bundle
    or base image (never pulled), a failed build (exit 4; inside a matrix run the stack's
    cells get status ``build_error`` instead)."""


class CellsFailed(MatrixError):
    """The matrix ran to the end but at least one cell did not end ``ok`` (exit 5)."""

    exit_code = 5


class Regressed(MatrixError):
    """``compare`` (or ``matrix --expect``) found a verdict that changed in a way its rules
    fail: bits that were equal and differ, a side no longer repeatable, ... (exit 6;
    runner/compare_reports/, docs/ci.md)."""

    exit_code = 6


class StepsFailed(MatrixError):
    """``gpu-host`` ran every step it could but at least one did not end ok, or was not run
    for want of time (exit 1; each step's exit code and log in ``OUT/steps.json``)."""
