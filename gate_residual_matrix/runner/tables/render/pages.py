"""The Markdown pages: ``reports/README.md`` (the answer first), one page per cell, the A/B.

:func:`markdown_pages` turns built tables (:func:`runner.tables.model.build.build_tables`) into
``{relative path: text}``:

* ``README.md``: the summary and staleness line, the answer per op (a sentence each, then
  each op's grid: :mod:`runner.tables.render.answers`), the pictures (``plots/*.svg``),
  cells without comparisons collapsed to one line per reason, where bits differ across cells,
  benchmarks and unreadable files; the lists are cut with the count of what was left out.
* ``cells/README.md``: the full headline (:mod:`runner.tables.model.headline`) per GPU, in
  tables of at most :data:`COLUMNS_PER_TABLE` columns, every cell (status, reason, time,
  commit, file) and the environment table, each cell linked to its page.
* ``cells/<cell>.md``: one cell's verdicts, bitwise comparison, accuracy, implementations
  that did not run, library rows, environment and timings.
* ``ab.md``: the A/B tables.

Every value from a report goes through :func:`runner.tables.render.markdown.md_text` (escaped,
one line); no line of a page is longer than :data:`runner.tables.render.markdown.LINE`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from gate_residual_matrix.runner.reports import tensors as report_tensors
from gate_residual_matrix.runner.tables.model.build import Tables
from gate_residual_matrix.runner.tables.model.cells import CellReport
from gate_residual_matrix.runner.tables.model.headline import (
    LEGEND,
    Column,
    Headline,
    Mark,
    cached_headline,
    name_list,
    not_run,
    staleness,
)
from gate_residual_matrix.runner.tables.model.sentence import op_answers
from gate_residual_matrix.runner.tables.model.table import Row, Table
from gate_residual_matrix.runner.tables.render.answers import answers_markdown
from gate_residual_matrix.runner.tables.render.links import page_names
from gate_residual_matrix.runner.tables.render.markdown import (
    HEADER,
    fit_table,
    fitted_tables,
    md_text,
    rows_markdown,
    wrap_markdown,
)
from gate_residual_matrix.runner.untrusted.names import shown

__all__ = ["CELL_SECTIONS", "COLUMNS_PER_TABLE", "headline_markdown",
           "markdown_pages"]

COLUMNS_PER_TABLE = 4
"""Headline columns per Markdown table, so a rendered table fits a screen."""
MAX_ACROSS_ROWS = 20
"""Rows of the across-cells table README.md shows (those where bits differ)."""
CELL_SECTIONS = ("verdicts", "bitwise", "accuracy", "implementations", "kernel_only",
                 "environment", "timings")
"""The per-cell tables (keys of :class:`runner.tables.model.table.Table`) a cell's page shows."""
def _legend(tables: Tables) -> str:
    """:data:`LEGEND` with the shown reports' tensor names."""
    return LEGEND.format(legend=report_tensors.legend(c.data for c in tables.cells))


def _header(column: Column, head: str | None, gpu: bool = False) -> str:
    parts = ([column.gpu] if gpu else []) + [column.stack, column.mode]
    label = " · ".join(parts)
    if column.status():
        label += f" · {column.status()}"
    return md_text(label)


def headline_markdown(h: Headline, link: Callable[[Column, Mark], str]) -> str:
    """The headline as Markdown: a ``###`` heading per GPU, then tables of at most
    :data:`COLUMNS_PER_TABLE` columns, as many as fit a line
    (:func:`runner.tables.render.markdown.fitted_tables`); each mark a link to
    ``link(column, mark)``."""
    if not h.columns:
        return "_No cell has comparisons yet._\n"
    parts = []
    for gpu in h.gpus():
        numbered = [(n, c) for n, c in enumerate(h.columns) if c.gpu == gpu]
        parts.append(f"### {md_text(gpu)}\n")
        columns = []
        for n, c in numbered:
            values = []
            for pair in h.pairs:
                m = h.marks.get((pair, n))
                stale = h.stale(m) if m else []
                values.append((f"[{md_text(m.label())}]({link(c, m)})" if m and m.compared
                               else md_text(m.label()) if m and m.missing else "—")
                              + (f" ⚠ {md_text('; '.join(stale))}" if stale else ""))
            columns.append((_header(c, h.head), values))
        parts += [t + "\n" for t in fitted_tables("pair", [md_text(p) for p in h.pairs],
                                                  columns, most=COLUMNS_PER_TABLE)]
    if h.never:
        parts.append("Not compared anywhere shown: " + "; ".join(
            f"{md_text(p)} ({md_text(why or 'no comparison')})" for p, why in h.never.items())
            + ".\n")
    return "\n".join(parts)


def _not_run_markdown(cells: Sequence[CellReport]) -> str:
    groups = not_run(cells)
    if not groups:
        return "Every cell shown has comparisons.\n"
    return "\n".join(f"- **{len(m)} {md_text(status)}**: {md_text(reason)} "
                     f"({md_text(name_list(m))})" for status, reason, m in groups) + "\n"


def _stale_line(tables: Tables) -> str:
    stale = [c for c in tables.cells if c.ours and staleness(c, tables.head)]
    head = f"`{tables.head[:12]}`" if tables.head else "unknown (no git checkout)"
    return (f"Current commit: {head}. {len(stale)} of {sum(c.ours for c in tables.cells)} of "
            "our reports were made at another commit or from a dirty tree (⚠ in the headline)."
            "\n")


def _readme(tables: Tables, names: Mapping[int, str],
            plots: Mapping[str, tuple[str, str]]) -> str:
    parts = [HEADER.format(title=tables.title()), tables.summary_line() + "\n",
             _stale_line(tables),
             "## Can I swap one implementation for another?\n",
             answers_markdown(op_answers(tables), names),
             "How to read a mark: " + _legend(tables) + " Every pair in one table, one column "
             "per GPU × stack × mode: [cells/README.md](cells/README.md).\n"]
    parts += [rows_markdown(t, t.rows) for t in tables.sections
              if t.key.startswith("seed-") or t.key == "versions"]
    parts.append("## Pictures\n")
    parts += [f"![{md_text(title)}](plots/{name})\n" for name, (title, _) in plots.items()]
    if not plots:
        parts.append("_No pictures: no cell has comparisons, or matplotlib is not installed "
                     "(`pip install -e '.[report]'`)._\n")
    parts += ["## Cells without comparisons\n",
              "Skipped, failed or placeholder cells, one line per status and reason (a cell's "
              "own stack name reads `<stack>`).\n", _not_run_markdown(tables.cells),
              "Every cell, with its status, time, commit, file and environment: "
              "[cells/README.md](cells/README.md)"
              + ("; the A/B tables: [ab.md](ab.md)" if tables.ab else "") + ".\n"]
    by_key = {t.key: t for t in tables.sections}
    if tables.across.comparable and "across-outputs" in by_key:
        table = by_key["across-outputs"]
        rows = [r for r in table.rows if any(k in ("diff", "void") for k in r.kinds)]
        shown = rows[:MAX_ACROSS_ROWS]
        cut = (f" {len(rows) - len(shown)} more such rows, and every group: "
               "[summary.json](summary.json) (`across`).") if len(rows) > len(shown) else ""
        parts.append(rows_markdown(
            Table("across-outputs", "Where bits differ across cells", table.headers,
                  note="Our cells grouped by the sha256 of each tensor's bits within one "
                       "problem (dtype, D, G, index dtype, seed): only the implementations "
                       "and cases whose bits differ between cells (or whose inputs differ: "
                       "`void`)." + cut, empty="The bits agree across every cell shown."),
            shown, level=2))
    for table in tables.sections:
        if table.key.startswith("bench") or table.key == "unreadable":
            parts.append(rows_markdown(table, table.rows))
    return "\n".join(parts)


def _cells_index(tables: Tables, names: Mapping[int, str]) -> str:
    h = cached_headline(tables.cells, tables, 0)
    by_key = {t.key: t for t in tables.sections}
    links = {i: name for i, name in names.items()}
    parts = ["# Every cell\n", "[Back to the headline](../README.md). " + tables.summary_line()
             + "\n", "## Headline, one column per GPU × stack × mode\n", _legend(tables) + "\n",
             headline_markdown(h, lambda c, m: names[c.cells[0].index if m.only_cell is None
                                                     else m.only_cell])]
    for key in ("cells", "environment"):
        if key in by_key:
            parts.append(rows_markdown(by_key[key], by_key[key].rows, links))
    groups = not_run(tables.cells)
    if groups:
        parts.append("## Cells without comparisons\n")
        parts += [f"- **{len(m)} {md_text(s)}**: {md_text(r)} ({md_text(name_list(m, len(m)))})"
                  for s, r, m in groups]
    return "\n".join(parts) + "\n"


def _cell_page(tables: Tables, cell: CellReport,
               rows: Mapping[tuple[str, int | None], list[Row]]) -> str:
    env = cell.environment
    facts = [("status", cell.status), ("reason", cell.reason or "—"), ("origin", cell.origin),
             ("GPU", cell.gpu or "—"), ("stack", cell.facet("stack")),
             ("mode", cell.facet("mode")), ("target", cell.facet("target")),
             ("torch", env.get("torch") or "—"),
             ("report made", staleness(cell, tables.head) or "at the current commit, clean"),
             ("report file", shown(cell.report.path.name))]
    parts = [f"# Cell {md_text(cell.label)}\n",
             "[Back to the headline](../README.md) · [every cell](README.md)\n",
             fit_table(["", ""], [[k, md_text(v)] for k, v in facts]) + "\n"]
    for table in tables.sections:
        if table.key in CELL_SECTIONS:
            parts.append(rows_markdown(table, rows.get((table.key, cell.index), []), level=2))
    return "\n".join(parts)


def _ab_page(tables: Tables) -> str:
    parts = ["# A/B\n", "[Back to the headline](README.md)\n"]
    parts += [rows_markdown(t, t.rows) for t in tables.sections if t.key.startswith("ab")]
    return "\n".join(parts)


def markdown_pages(tables: Tables, plots: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """``{path relative to the reports directory: Markdown text}`` for every page.

    Example:
        >>> sorted(markdown_pages(tables, {}))[:2]
        ['README.md', 'ab.md']
    """
    names = page_names(tables.cells)
    pages = {"README.md": _readme(tables, names, plots),
             "cells/README.md": _cells_index(tables, names)}
    if tables.ab:
        pages["ab.md"] = _ab_page(tables)
    rows: dict[tuple[str, int | None], list[Row]] = {}
    for table in tables.sections:
        if table.key in CELL_SECTIONS:
            for r in table.rows:
                rows.setdefault((table.key, r.cell), []).append(r)
    for cell in tables.cells:
        pages[f"cells/{names[cell.index]}"] = _cell_page(tables, cell, rows)
    return {path: wrap_markdown(text) for path, text in pages.items()}
