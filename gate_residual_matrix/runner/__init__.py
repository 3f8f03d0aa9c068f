"""Reproducibility matrix runner for GPU kernels.

Pipeline (one module a stage): :mod:`runner.config` loads matrix.yaml →
:mod:`runner.cells` expands and selects cells → :mod:`runner.backends` runs each
cell (host subprocess or docker container) → :mod:`runner.cell` runs one cell and
builds its report → :mod:`runner.report` validates and writes it atomically →
:mod:`runner.tables` renders the tables.
"""

from __future__ import annotations

__all__ = ["__version__"]
__version__ = "0.1.0"
