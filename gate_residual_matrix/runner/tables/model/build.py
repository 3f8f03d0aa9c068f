"""Build the tables from the reports: :func:`build_tables` gives :class:`Tables`, which every
renderer (:mod:`runner.tables.render`) lays out.

The tables, in order (docs/tables.md lists them), each a :class:`~runner.tables.model.table.
Table` of display strings:

0. Verdicts: one line per cell and implementation pair (:mod:`runner.tables.model.verdicts`).
1. Bitwise comparison per cell (pair x case x tensor); then the seed comparison, a reference
   report beside our cells (:mod:`runner.tables.model.seed`).
2. Identical bits across cells: inputs, then each implementation's outputs, grouped by sha256
   (:mod:`runner.tables.model.bits`); then, where a cell ran several versions of a library
   implementation, the first version whose bits changed (:mod:`runner.tables.model.versions`).
3. A/B of two cells (``--ab``; by default two of our cells with results differing in one facet;
   :mod:`runner.tables.model.ab`).
4. Accuracy vs fp64 and determinism (:mod:`runner.tables.model.accuracy`).
5. Cells, implementations that did not run, library rows loaded kernel-only, and the
   environment inventory (:mod:`runner.tables.model.inventory`,
   :mod:`runner.tables.model.kernel_only`).
6. Timings with effective bandwidth; then ``reports/bench/*.json``
   (:mod:`runner.tables.model.timings`); then unreadable files.

A case may have its own dtypes (:mod:`runner.tables.model.cases`): every table shows each
case's, and ``--dtype`` keeps the cases of those dtypes (and the cells that have one). A cell
whose status is not ``ok`` is never dropped: it has its rows in the bitwise, cells and
environment tables and is named under the others.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gate_residual_matrix.runner.reports import tensors as report_tensors
from gate_residual_matrix.runner.reports.store import LoadedReport
from gate_residual_matrix.runner.tables.model.ab import DEFAULT_WHY, ab_tables, default_ab
from gate_residual_matrix.runner.tables.model.accuracy import accuracy_table
from gate_residual_matrix.runner.tables.model.bits import (
    Across,
    across_cells,
    across_tables,
    bitwise_table,
)
from gate_residual_matrix.runner.tables.model.cases import CaseFilter
from gate_residual_matrix.runner.tables.model.cells import CellReport, load_cells
from gate_residual_matrix.runner.tables.model.filters import Filters, find_cell
from gate_residual_matrix.runner.tables.model.inventory import (
    cells_table,
    environment_table,
    implementations_table,
    shown_path,
)
from gate_residual_matrix.runner.tables.model.kernel_only import kernel_only_table
from gate_residual_matrix.runner.tables.model.seed import seed_tables
from gate_residual_matrix.runner.tables.model.table import Row, Table
from gate_residual_matrix.runner.tables.model.timings import bench_tables, timings_table
from gate_residual_matrix.runner.tables.model.values import STATUSES
from gate_residual_matrix.runner.tables.model.verdicts import verdict_table
from gate_residual_matrix.runner.tables.model.versions import versions_table
from gate_residual_matrix.runner.untrusted.names import shown

__all__ = ["Tables", "build_tables"]


@dataclass
class Tables:
    """Everything the renderers need: the shown cells, the tables in order, and what could
    not be read (``(file, problem)``, report files and benchmark files)."""

    cells: list[CellReport]
    readable: int
    filters: Filters
    sections: list[Table]
    across: Across
    ab: list[tuple[CellReport, CellReport]] = field(default_factory=list)
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    cache: dict[Any, Any] = field(default_factory=dict, repr=False)
    head: str | None = None

    def title(self) -> str:
        """``<op>[, <op> ...] reproducibility matrix``: the ops of the shown cells, in the
        order of :data:`ops.OPS` (a foreign report is the first op's)."""
        return report_tensors.title(c.data for c in self.cells)

    def summary_line(self) -> str:
        """E.g. ``3 cell reports: 2 ours (1 ok, 1 error), 1 foreign; 1 unreadable file.``"""
        ours = [c for c in self.cells if c.ours]
        counts = Counter(c.status for c in ours)
        order = [*STATUSES, *sorted(set(counts) - set(STATUSES))]
        statuses = ", ".join(f"{counts[s]} {s}" for s in order if counts[s])
        parts = [f"{len(ours)} ours ({statuses})" if ours else "0 ours"]
        foreign = len(self.cells) - len(ours)
        if foreign:
            parts.append(f"{foreign} foreign")
        line = f"{len(self.cells)} cell reports: {', '.join(parts)}"
        if self.unreadable:
            n = len(self.unreadable)
            line += f"; {n} unreadable file{'s' if n > 1 else ''}"
        line += "."
        if self.filters.active:
            line += (f" Filtered by `{self.filters.describe()}`: {len(self.cells)} of "
                     f"{self.readable} readable reports shown.")
        return line


def build_tables(reports: Sequence[LoadedReport], *, relative_to: Path | None = None,
                 filters: Filters | None = None, ab: Sequence[tuple[str, str]] | None = None,
                 bench_dir: Path | None = None, head: str | None = None) -> Tables:
    """The tables for ``reports`` (as :func:`runner.reports.store.read_reports` returns them).

    Args:
        relative_to: file paths are shown relative to this directory (the outputs').
        filters: which cells and implementations to show; all when None.
        ab: pairs of cell names (label, cell id or report file stem) to show side by side;
            None for the default pair, ``[]`` for none.
        bench_dir: a directory of benchmark JSON (``reports/bench``); None for none.
        head: the project's current commit: reports made at another one are marked stale
            (:func:`runner.tables.model.headline.staleness`); None when unknown.

    Raises:
        SelectionError: a filter value that selects no report (values match as typed:
            ``--gpu H200`` selects "NVIDIA H200", :func:`runner.tables.model.filters.matches`) or an
            ``--ab`` name that no report has.

    Example:
        >>> t = build_tables(read_reports(Path("reports")), filters=Filters(stack=("host",)))
        >>> [s.key for s in t.sections][:3]
        ['verdicts', 'bitwise', 'across']
    """
    filters = filters or Filters()
    everything = load_cells(reports)
    by_cell, by_dtype = CaseFilter.cell_part(filters).resolve(everything), CaseFilter.of(filters)
    by_dtype.check(everything)
    filters = replace(by_cell, dtype=filters.dtype)
    cells = [replace(c, index=i) for i, c in enumerate(
        c for c in by_cell.select(everything) if by_dtype.keeps_cell(c))]
    if ab is None:
        pairs = [p for p in [default_ab(cells)] if p is not None]
        why = f"; {DEFAULT_WHY}"
    else:
        pairs = [(find_cell(everything, a), find_cell(everything, b)) for a, b in ab]
        why = "; chosen with `--ab`"
    across = across_cells(cells, filters)
    versions = versions_table(cells, filters)
    sections = [verdict_table(cells, filters), bitwise_table(cells, filters),
                *seed_tables(cells, filters), *across_tables(across, cells),
                *([versions] if versions.rows else [])]
    for a, b in pairs:
        sections += ab_tables(a, b, filters, why)
    sections += [accuracy_table(cells, filters), cells_table(cells, relative_to),
                 implementations_table(cells, filters), kernel_only_table(cells, filters),
                 environment_table(cells),
                 timings_table(cells, filters)]
    unreadable = [(shown_path(r.path, relative_to), shown(r.problem or "")) for r in reports
                  if not r.ok]
    if bench_dir is not None:
        bench, problems = bench_tables(bench_dir)
        if bench:
            sections.append(Table("bench", "Benchmarks", (),
                                  note="Benchmark results under `bench/`, shown as written."))
            sections += bench
        unreadable += [(shown_path(path, relative_to), shown(problem))
                       for path, problem in problems]
    if unreadable:
        sections.append(Table("unreadable", "Unreadable files", ("file", "problem"),
                              [Row(u) for u in unreadable],
                              note="Files that are not a report this reader can use; "
                                   "nothing in them is shown above."))
    return Tables(cells, len(everything), filters, sections, across, pairs, unreadable,
                  head=head)
