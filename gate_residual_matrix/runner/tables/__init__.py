"""The tables: the reports rendered as ``reports/README.md``, ``index.html``, ``summary.csv``,
``summary.json``, a page per cell and pictures. The last stage of the pipeline.

Two layers, imported in one direction only (tests/test_import_cycles.py checks it):

* :mod:`runner.tables.model` reads the reports into typed objects and builds every table as
  display strings: :class:`~runner.tables.model.cells.CellReport` (one report),
  :class:`~runner.tables.model.filters.Filters`, the row builders of each table, and
  :func:`~runner.tables.model.build.build_tables`, which gives :class:`Tables`.
* :mod:`runner.tables.render` lays built tables out, one module per format: Markdown
  (``markdown``, ``pages``), HTML (``html``), CSV and JSON (``summary``), SVG (``plots``).

:func:`~runner.tables.write.write_tables` reads, builds once, renders every format (or those
named: :data:`~runner.tables.formats.FORMATS`, name -> format) and writes the files. This
module names the entry points the rest of the runner uses (``compare``,
runner/compare_reports/, reads reports through the model's cells, pairs and configuration).

Example:
    >>> from gate_residual_matrix.runner import tables
    >>> tables.write_tables(Path("reports"), filters=tables.Filters(stack=("host",)))
    PosixPath('reports/README.md')
"""

from __future__ import annotations

from gate_residual_matrix.runner.tables.formats import FORMATS
from gate_residual_matrix.runner.tables.model.bits import PairResult, pair_results
from gate_residual_matrix.runner.tables.model.build import Tables, build_tables
from gate_residual_matrix.runner.tables.model.cells import (
           CellReport,
           cell_label,
           configuration,
           load_cells,
)
from gate_residual_matrix.runner.tables.model.filters import FACETS, Filters
from gate_residual_matrix.runner.tables.model.values import ABSENT, format_cmp
from gate_residual_matrix.runner.tables.model.versions import library_row
from gate_residual_matrix.runner.tables.render.markdown import (
           markdown,
           md_text,
           render_markdown,
           slug,
)
from gate_residual_matrix.runner.tables.write import OUTPUTS, write_tables

__all__ = ["ABSENT", "FACETS", "FORMATS", "OUTPUTS", "CellReport", "Filters", "PairResult",
           "Tables",
           "build_tables", "cell_label", "configuration", "format_cmp", "library_row",
           "load_cells", "markdown", "md_text", "pair_results", "render_markdown", "slug",
           "write_tables"]
