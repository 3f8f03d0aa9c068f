"""Reproducibility matrix runner for GPU kernels.

Pipeline (one module a stage): :mod:`runner.config.matrix` loads matrix.yaml →
:mod:`runner.plan.cells` expands and selects cells → :mod:`runner.backends` runs each
cell (host subprocess or docker container) → :mod:`runner.cell.run` runs one cell and
builds its report → :mod:`runner.reports.store` validates and writes it atomically →
:mod:`runner.tables` renders the tables.
"""

from __future__ import annotations

__all__ = ["__version__"]
__version__ = "0.1.0"
