"""``python -m gate_residual_matrix.bench``: :func:`bench.cli.main`."""

from __future__ import annotations

import contextlib

from gate_residual_matrix.bench.cli import main

with contextlib.suppress(BrokenPipeError):
    raise SystemExit(main())
