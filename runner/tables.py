"""Render the reports as tables: ``reports/README.md``, ``index.html``, ``summary.csv|json``.

The last stage of the pipeline. :func:`build_tables` turns the reports (readable or not) into
an ordered list of :class:`~runner.aggregate.Table` (docs/tables.md lists them):

0. Verdicts: one line per cell and implementation pair (:mod:`runner.table_verdicts`).
1. Bitwise comparison per cell (pair x case x tensor).
2. Identical bits across cells: inputs, then each implementation's outputs, grouped by sha256.
3. A/B of two cells (``--ab``; by default two of our cells with results differing in one facet;
   :mod:`runner.table_ab`).
4. Accuracy vs fp64 and determinism.
5. Cells, implementations that did not run, and the environment inventory.
6. Timings with effective bandwidth; then ``reports/bench/*.json``; then unreadable files.

A case may have its own dtypes (:mod:`runner.table_cases`): every table shows each case's, and
``--dtype`` keeps the cases of those dtypes (and the cells that have one).

:func:`render_markdown` writes them as GitHub Markdown (tabulate), :mod:`runner.html` as one
self-contained page, :mod:`runner.summary` as CSV and JSON. A cell whose status is not ``ok``
is never dropped: it has its rows in the bitwise, cells and environment tables and is named
under the others. The outputs are a pure function of the reports (no timestamps), so
regenerating them changes nothing; each is written atomically.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tabulate import tabulate

from runner import report_tensors
from runner.aggregate import (
    FACETS,
    STATUSES,
    Cell,
    Filters,
    Row,
    Table,
    cell_label,
    find_cell,
    format_cmp,
    load_cells,
)
from runner.markdown import HEADER, md_text
from runner.report import LoadedReport, read_reports, write_text_atomic
from runner.table_ab import DEFAULT_WHY, ab_tables, default_ab
from runner.table_bits import Across, across_cells, across_tables, bitwise_table
from runner.table_cases import CaseFilter
from runner.table_kernel_only import kernel_only_table
from runner.table_seed import seed_tables
from runner.table_stats import (
    accuracy_table,
    bench_tables,
    cells_table,
    environment_table,
    implementations_table,
    timings_table,
)
from runner.table_verdicts import verdict_table

__all__ = ["FACETS", "OUTPUTS", "Filters", "Tables", "build_tables", "cell_label", "format_cmp",
           "render_markdown", "write_tables"]

OUTPUTS = ("README.md", "index.html", "summary.csv", "summary.json")
"""The files :func:`write_tables` writes, in one directory."""



@dataclass
class Tables:
    """Everything the renderers need: the shown cells, the tables in order, and what could
    not be read (``(file, problem)``, report files and benchmark files)."""

    cells: list[Cell]
    readable: int
    filters: Filters
    sections: list[Table]
    across: Across
    ab: list[tuple[Cell, Cell]] = field(default_factory=list)
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    cache: dict[str, Any] = field(default_factory=dict, repr=False)
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


def _relative(path: Path, relative_to: Path | None) -> str:
    if relative_to is not None:
        try:
            return path.resolve().relative_to(Path(relative_to).resolve()).as_posix()
        except (ValueError, RuntimeError, OSError):  # RuntimeError: a symlink loop
            pass
    return path.as_posix()


def build_tables(reports: Sequence[LoadedReport], *, relative_to: Path | None = None,
                 filters: Filters | None = None, ab: Sequence[tuple[str, str]] | None = None,
                 bench_dir: Path | None = None, head: str | None = None) -> Tables:
    """The tables for ``reports`` (as :func:`runner.report.read_reports` returns them).

    Args:
        relative_to: file paths are shown relative to this directory (the outputs').
        filters: which cells and implementations to show; all when None.
        ab: pairs of cell names (label, cell id or report file stem) to show side by side;
            None for the default pair, ``[]`` for none.
        bench_dir: a directory of benchmark JSON (``reports/bench``); None for none.
        head: the project's current commit: reports made at another one are marked stale
            (:func:`runner.table_headline.staleness`); None when unknown.

    Raises:
        SelectionError: a filter value that selects no report (values match as typed:
            ``--gpu H200`` selects "NVIDIA H200", :func:`runner.aggregate.matches`) or an
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
    sections = [verdict_table(cells, filters), bitwise_table(cells, filters),
                *seed_tables(cells, filters), *across_tables(across, cells)]
    for a, b in pairs:
        sections += ab_tables(a, b, filters, why)
    sections += [accuracy_table(cells, filters), cells_table(cells, relative_to),
                 implementations_table(cells, filters), kernel_only_table(cells, filters),
                 environment_table(cells),
                 timings_table(cells, filters)]
    unreadable = [(_relative(r.path, relative_to), r.problem or "") for r in reports if not r.ok]
    if bench_dir is not None:
        bench, problems = bench_tables(bench_dir)
        if bench:
            sections.append(Table("bench", "Benchmarks", (),
                                  note="Benchmark results under `bench/`, shown as written."))
            sections += bench
        unreadable += [(_relative(path, relative_to), problem) for path, problem in problems]
    if unreadable:
        sections.append(Table("unreadable", "Unreadable files", ("file", "problem"),
                              [Row(u) for u in unreadable],
                              note="Files that are not a report this reader can use; "
                                   "nothing in them is shown above."))
    return Tables(cells, len(everything), filters, sections, across, pairs, unreadable,
                  head=head)


def slug(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def _markdown_table(table: Table) -> str:
    heading = f"{'#' * table.level} {md_text(table.title)}\n"
    parts = [heading] + ([table.note + "\n"] if table.note else [])
    if table.headers:
        if table.rows:
            rows = [[md_text(v) for v in r.values] for r in table.rows]
            parts.append(tabulate(rows, headers=list(table.headers), tablefmt="github",
                                  disable_numparse=True) + "\n")
        else:
            parts.append(f"_{table.empty}_\n")
    if table.footer:
        parts.append(table.footer + "\n")
    return "\n".join(parts)


def markdown(tables: Tables) -> str:
    """The Markdown text of ``reports/README.md`` for built tables."""
    top = [t for t in tables.sections if t.level == 2]
    contents = " · ".join(f"[{t.title}](#{slug(t.title)})" for t in top)
    parts = [HEADER.format(title=tables.title()), tables.summary_line() + "\n",
             f"Contents: {contents}\n"]
    parts += [_markdown_table(t) for t in tables.sections]
    return "\n".join(parts)


def render_markdown(reports: Sequence[LoadedReport], relative_to: Path | None = None,
                    **options) -> str:
    """The Markdown text of ``reports/README.md`` (options as for :func:`build_tables`).

    Example:
        >>> text = render_markdown(read_reports(Path("reports")), Path("reports"))
        >>> "## Bitwise comparison per cell" in text
        True
    """
    return markdown(build_tables(reports, relative_to=relative_to, **options))


def _write_if_changed(path: Path, text: str, durable: bool = True) -> None:
    """Write ``text`` atomically unless ``path`` already holds exactly it (a thousand cell
    pages are rewritten only where they changed). ``durable=False``: renamed into place
    without fsync (pages and pictures that the next run rewrites: a thousand fsyncs took
    5 s on the CPU machine); readers still see the old or the new file, whole."""
    data = text.encode("utf-8")
    try:
        if path.read_bytes() == data:
            return
    except OSError:
        pass
    if durable:
        write_text_atomic(path, text)
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _sweep(directory: Path, suffix: str, keep: set[str]) -> None:
    """Remove this tool's earlier outputs (``*<suffix>`` files) that it no longer writes."""
    if directory.is_dir() and not directory.is_symlink():
        for path in directory.glob(f"*{suffix}"):
            if path.name not in keep and path.is_file() and not path.is_symlink():
                path.unlink()


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (as it was after). The tables
    make millions of short-lived rows beside a parsed report of millions of values, and each
    full collection walks them all: 6 of 41 s for a 20,000-case report. What they make has no
    reference cycles to find; reference counting frees it as before."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def write_tables(reports_dir: Path, out: Path | None = None, *, filters: Filters | None = None,
                 ab: Sequence[tuple[str, str]] | None = None,
                 head: str | bool | None = True) -> Path:
    """Read every report under ``reports_dir`` and write the outputs atomically.

    Writes, next to ``out``: the Markdown (``README.md``: the headline first), ``index.html``,
    ``summary.csv``, ``summary.json``, ``cells/README.md`` and ``cells/<cell>.md`` (one page
    per cell), ``ab.md`` (when an A/B is shown) and ``plots/*.svg``; earlier pages and
    plots this run no longer writes are removed from ``cells/`` and ``plots/``.

    Args:
        reports_dir: the reports directory (read recursively; ``bench/*.json`` as benchmarks;
            the ``summary.json`` this function writes is not read as a report).
        out: the Markdown file; ``<reports_dir>/README.md`` when None.
        filters, ab: as for :func:`build_tables`.
        head: the current commit for staleness marks; True (default) asks git
            (:func:`runner.table_headline.current_commit`), None means unknown.

    Returns:
        The Markdown path written.
    Raises:
        ReportError: ``reports_dir`` is not a directory (bad files never raise: they are
            listed under "Unreadable files").
        SelectionError: a filter value or ``--ab`` name no report has; nothing is written.

    Example:
        >>> write_tables(Path("reports"))
        PosixPath('reports/README.md')
    """
    with _gc_paused():
        return _write_tables(Path(reports_dir), out, filters=filters, ab=ab, head=head)


def _write_tables(reports_dir: Path, out: Path | None, *, filters: Filters | None,
                  ab: Sequence[tuple[str, str]] | None, head: str | bool | None) -> Path:
    """:func:`write_tables`'s work."""
    from runner import html, pages, plots, summary
    from runner.table_headline import current_commit

    reports_dir = Path(reports_dir)
    out = reports_dir / OUTPUTS[0] if out is None else Path(out)
    # this tool's outputs, next to ``out`` and in the reports directory, are never reports
    ours = {os.path.realpath(d / name) for d in (out.parent, reports_dir) for name in OUTPUTS}
    # realpath, not Path.resolve: a symlink loop named *.json is a bad file, not a crash
    reports = read_reports(reports_dir, skip=ours)
    tables = build_tables(reports, relative_to=out.parent, filters=filters, ab=ab,
                          bench_dir=reports_dir / "bench",
                          head=current_commit() if head is True else head or None)
    headline = pages.choose_level(tables.cells, tables, html.HTML_MARKS)
    figures = plots.render_plots(tables.cells, headline, reports_dir / "bench")
    texts = {out.parent / name: text for name, text in
             pages.markdown_pages(tables, figures).items()}
    texts[out] = texts.pop(out.parent / OUTPUTS[0])
    texts[out.parent / OUTPUTS[1]] = html.render_html(tables, figures, headline)
    texts[out.parent / OUTPUTS[2]] = summary.render_csv(tables)
    texts[out.parent / OUTPUTS[3]] = summary.render_json(tables)
    texts.update({out.parent / "plots" / name: svg for name, (_, svg) in figures.items()})
    for directory in ("cells", "plots"):
        (out.parent / directory).mkdir(parents=True, exist_ok=True)
    main = {out, *(out.parent / name for name in OUTPUTS[1:])}
    for path, text in texts.items():
        _write_if_changed(path, text, durable=path in main)
    _sweep(out.parent / "cells", ".md", {p.name for p in texts if p.parent.name == "cells"})
    _sweep(out.parent / "plots", ".svg", set(figures))
    if not tables.ab and (out.parent / "ab.md").is_file():
        (out.parent / "ab.md").unlink()
    return out
