"""Render the tables as ``reports/index.html``: one self-contained page that opens to the answer.

The first screen holds the summary and staleness line, filters that take what people type
(GPU, stack, mode, pair: a part of the name, any case, alternatives separated by commas, so
``h200`` finds "NVIDIA H200") and each op's sentence (:mod:`runner.tables.render.answers_html`);
then each op's grid, at the page's width. Below: the full headline
(:mod:`runner.tables.model.headline`: implementation pairs × GPU × stack × mode, each mark a
link to the cell's page ``cells/<cell>.md``) in a box of its own, the pictures
(``plots/*.svg``, inlined), cells without comparisons,
one line per reason; the cells table; where bits differ across cells; benchmarks; unreadable
files. Per-cell tables (bitwise, accuracy, timings, environment) are on the cell pages, so the
page stays small at any matrix size: past :data:`HTML_MARKS` marks the headline merges modes,
then stacks (:func:`runner.tables.model.headline.choose_level`).

CSS and JavaScript live in ``runner/assets/`` and are inlined; the cells' and columns' facets
are embedded as JSON (every ``<``, ``>``, ``&`` escaped). Elements with ``data-cell`` or
``data-col`` are hidden by the filters; everything is rendered here, so the page reads the
same with scripts off (unfiltered).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from gate_residual_matrix.runner.reports import tensors as report_tensors
from gate_residual_matrix.runner.tables.model.build import Tables
from gate_residual_matrix.runner.tables.model.cases import DTYPE_NAMES, cell_dtypes
from gate_residual_matrix.runner.tables.model.cells import CellReport
from gate_residual_matrix.runner.tables.model.headline import (
    LEGEND,
    LEVELS,
    Column,
    Headline,
    choose_level,
    name_list,
    not_run,
    staleness,
)
from gate_residual_matrix.runner.tables.model.sentence import op_answers
from gate_residual_matrix.runner.tables.model.table import Table
from gate_residual_matrix.runner.tables.model.values import ABSENT, status_kind
from gate_residual_matrix.runner.tables.render.answers_html import answers_html, grid_columns
from gate_residual_matrix.runner.tables.render.links import mark_link, page_names

__all__ = ["FILTER_FACETS", "HTML_MARKS", "render_html"]

ASSETS = Path(__file__).resolve().parents[2] / "assets"
"""The page's CSS and JavaScript (``runner/assets/``), inlined."""
FILTER_FACETS = ("gpu", "stack", "mode", "pair")
"""The facets the page filters on, in the order of its controls."""
HTML_MARKS = 6000
"""The most headline marks (pairs × columns) the page shows before it merges columns."""
MAX_ACROSS_ROWS = 200

_WRAP = 60
_NUMBER = re.compile(r"^([-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?x?|inf)$")


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _script_json(value: Any) -> str:
    """JSON to embed in a ``<script>`` element: ``<``, ``>`` and ``&`` as ``\\u`` escapes, so
    no report string can close the element (``</script>``) or switch the HTML parser into
    its escaped states (``<!--``, ``<script``) that would swallow the page's own script.

    Example:
        >>> _script_json(["<!--<script>"])
        '["\\\\u003c!--\\\\u003cscript\\\\u003e"]'
    """
    text = json.dumps(value, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _inline(note: str) -> str:
    """Plain text with ``code`` spans in backticks, as HTML."""
    parts = _e(note).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def _attr_cell(index: int | None) -> str:
    return "" if index is None else f' data-cell="{index}"'


def _attr_dtype(dtype: str | None) -> str:
    """``data-dtype`` for a row about one storage dtype (``bfloat16/int64`` -> bfloat16)."""
    dtype = (dtype or "").split("/")[0]
    return f' data-dtype="{_e(dtype)}"' if dtype in DTYPE_NAMES else ""


def _facets(cell: CellReport) -> dict[str, Any]:
    """The cell's filter values as the headline shows them (``CPU`` for a cpu target), and
    ``dtype``, the list of its cases' dtypes."""
    gpu = "CPU" if cell.target == "cpu" else cell.facet("gpu")
    return {"gpu": gpu, "stack": cell.facet("stack"), "mode": cell.facet("mode"),
            "dtype": cell_dtypes(cell) or [ABSENT]}


class _Ids:
    """Unique element ids from table keys (an A/B pair may appear twice)."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def __call__(self, key: str) -> str:
        n = self.seen.get(key, 0)
        self.seen[key] = n + 1
        return key if n == 0 else f"{key}-{n + 1}"


def _numeric_columns(table: Table) -> list[bool]:
    """Columns whose values are all numbers (or absent): right-aligned."""
    return [all(_NUMBER.match(r.values[i]) or r.values[i] == ABSENT for r in table.rows)
            and any(_NUMBER.match(r.values[i]) for r in table.rows)
            for i in range(len(table.headers))]


def _td(value: str, kind: str, numeric: bool) -> str:
    """One value: its colour class, right-aligned in a numeric column, wrapped if long."""
    classes = [f"k-{kind}"] if kind else []
    if numeric:
        classes.append("num")
    elif len(value) > _WRAP:
        classes.append("wrap")
    attr = f' class="{" ".join(classes)}"' if classes else ""
    return f"<td{attr}>{_e(value)}</td>"


def _table(table: Table, ids: _Ids) -> str:
    tid = ids(table.key)
    tag = "h2" if table.level <= 2 else "h3"
    out = [f'<section id="{tid}" class="level{table.level}"><{tag}>{_e(table.title)}</{tag}>']
    if table.note:
        out.append(f'<p class="note">{_inline(table.note)}</p>')
    if table.headers:
        if table.rows:
            if any(row.cell is not None for row in table.rows):
                out.append(f'<p class="count" id="count-t-{tid}"></p>')
            out.append(f'<div class="scroll"><table class="data" id="t-{tid}"><thead><tr>')
            out += [f"<th>{_e(h)}</th>" for h in table.headers]
            out.append("</tr></thead><tbody>")
            numeric = _numeric_columns(table)
            dtype_at = table.headers.index("dtype") if "dtype" in table.headers else None
            for row in table.rows:
                kinds = row.kinds + ("",) * (len(row.values) - len(row.kinds))
                tds = "".join(_td(v, k, n) for v, k, n in zip(row.values, kinds, numeric,
                                                                strict=False))
                dtype = row.values[dtype_at] if dtype_at is not None else None
                out.append(f"<tr{_attr_cell(row.cell)}{_attr_dtype(dtype)}>{tds}</tr>")
            out.append("</tbody></table></div>")
        else:
            out.append(f'<p class="empty">{_e(table.empty)}</p>')
    if table.footer:
        out.append(f'<p class="footer">{_inline(table.footer)}</p>')
    out.append("</section>")
    return "\n".join(out)


def _column_head(column: Column, head: str | None) -> str:
    status = column.status()
    return (f'<span class="gpu">{_e(column.gpu)}</span><br>{_e(column.stack)}<br>'
            f'<span class="mode">{_e(column.mode)}</span>'
            + (f'<br><span class="st-warn">{_e(status)}</span>' if status else ""))


def _headline(h: Headline, names: dict[int, str], legend: str) -> str:
    merged = ("" if h.level == 0 else f" Columns are merged ({_e(LEVELS[h.level])}: the worst "
              'mark of their cells) to keep this page small; one column per mode: '
              '<a href="cells/README.md">cells/README.md</a>.')
    out = ['<section id="headline" class="level2"><h2>Every pair, one column per GPU × stack × '
           "mode</h2>",
           '<details class="legend"><summary>Rows: candidate vs baseline; columns: GPU × stack '
           f"(library versions) × mode. How to read a mark</summary><p>{_inline(legend)}"
           f"{merged}</p></details>"]
    if not h.columns:
        return "\n".join([*out, '<p class="empty">No cell has comparisons yet.</p></section>'])
    out.append('<p class="count" id="count-t-headline"></p>')
    out.append('<div class="scroll headbox"><table class="data headline" id="t-headline">'
               '<thead><tr><th class="pair">pair</th>')
    out += [f'<th data-col="{n}">{_column_head(c, h.head)}</th>' for n, c in enumerate(h.columns)]
    out.append("</tr></thead><tbody>")
    for pair in h.pairs:
        tds = []
        for n in range(len(h.columns)):
            mark = h.marks.get((pair, n))
            if mark is None:
                tds.append(f'<td data-col="{n}" class="k-absent">—</td>')
                continue
            label = _e(mark.label())
            if mark.compared:
                label = f'<a href="{_e(mark_link(mark, names))}">{label}</a>'
            stale = h.stale(mark)
            if stale:
                label += (' <span class="stale" title="not made at the current commit, or from '
                          f'a dirty tree">⚠ {_e("; ".join(stale))}</span>')
            tds.append(f'<td data-col="{n}" class="k-{mark.kind()}">{label}</td>')
        out.append(f'<tr data-pair="{_e(pair)}"><th class="pair">{_e(pair)}</th>'
                   + "".join(tds) + "</tr>")
    out.append("</tbody></table></div>")
    if h.never:
        out.append(f'<details class="legend"><summary>{len(h.never)} pairs not compared in any '
                   "column shown</summary><p>" + _e("; ".join(
                       f"{p} ({why or 'no comparison'})" for p, why in h.never.items()))
                   + ".</p></details>")
    out.append("</section>")
    return "\n".join(out)


_SVG_HEAD = re.compile(r"^.*?(?=<svg)", re.S)


def _plots(plots: dict[str, tuple[str, str]]) -> str:
    out = ['<section id="plots" class="level2"><h2>Pictures</h2><div class="plots">']
    for name, (title, svg) in plots.items():
        out.append(f'<figure><a href="plots/{_e(name)}" title="open {_e(name)}">'
                   f'{_SVG_HEAD.sub("", svg, count=1)}</a><figcaption>{_e(title)}</figcaption>'
                   "</figure>")
    if not plots:
        out.append('<p class="empty">No figures: no report has comparisons or accuracy '
                   "figures yet.</p>")
    out.append("</div></section>")
    return "\n".join(out)


def _not_run(cells: Sequence[CellReport]) -> str:
    groups = not_run(cells)
    out = ['<section id="not-run" class="level2"><h2>Cells without comparisons</h2>']
    if not groups:
        out.append('<p class="empty">Every cell shown has comparisons.</p>')
    else:
        out.append("<ul>")
        out += [f'<li><span class="badge st-{status_kind(s) or "none"}">{len(m)} {_e(s)}</span> '
                f"{_e(r)} <span class=\"names\">({_e(name_list(m))})</span></li>"
                for s, r, m in groups]
        out.append("</ul>")
    out.append("</section>")
    return "\n".join(out)


def _filters(cells: Sequence[CellReport], h: Headline) -> str:
    values = {"gpu": [c.gpu for c in h.columns], "stack": [c.stack for c in h.columns],
              "mode": [c.mode for c in h.columns], "pair": h.pairs}
    out = ['<form id="filters" class="filters" onsubmit="return false" role="search">']
    hints = {"gpu": "GPU, e.g. h200", "stack": "stack or version, e.g. vllm",
             "mode": "mode, e.g. plain", "pair": "pair, e.g. numba"}
    for facet in FILTER_FACETS:
        found = list(dict.fromkeys(values[facet]))[:200]
        out.append(f'<label>{"GPU" if facet == "gpu" else facet} <input type="search" '
                   f'data-dim="{facet}" list="dl-{facet}" placeholder="{_e(hints[facet])}" '
                   f'autocomplete="off"></label><datalist id="dl-{facet}">'
                   + "".join(f'<option value="{_e(v)}">' for v in found) + "</datalist>")
    out.append('<button type="button" id="reset">Show all</button>'
               '<output id="shown" aria-live="polite"></output></form>')
    return "\n".join(out)


def _across(tables: Tables, ids: _Ids) -> str:
    by_key = {t.key: t for t in tables.sections}
    table = by_key.get("across-outputs")
    if table is None or not tables.across.comparable:
        return ""
    rows = [r for r in table.rows if any(k in ("diff", "void") for k in r.kinds)]
    shown = rows[:MAX_ACROSS_ROWS]
    cut = (f" {len(rows) - len(shown)} more such rows, and every group: `summary.json` "
           "(`across`).") if len(rows) > len(shown) else ""
    return _table(Table("across-outputs", "Where bits differ across cells", table.headers,
                        shown, note="Our cells grouped by the sha256 of each tensor's bits "
                        "within one problem: only the implementations and cases whose bits "
                        "differ between cells (or whose inputs differ: `void`)." + cut,
                        empty="The bits agree across every cell shown."), ids)


def _asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


def render_html(tables: Tables, plots: dict[str, tuple[str, str]] | None = None,
                h: Headline | None = None) -> str:
    """The page for built tables (:func:`runner.tables.model.build.build_tables`), as one string.

    Args:
        plots: ``{file name: (title, SVG)}`` (:func:`runner.tables.render.plots.render_plots`);
            none when None.
        h: the headline to show; when None, :func:`~runner.tables.model.headline.choose_level` with
            :data:`HTML_MARKS`.

    Example:
        >>> page = render_html(build_tables(read_reports(Path("reports"))))
        >>> page.startswith("<!DOCTYPE html>") and "http" not in page.split("<body>")[0]
        True
    """
    cells = tables.cells
    h = h or choose_level(cells, tables, HTML_MARKS)
    names = page_names(cells)
    ids = _Ids()
    ids("headline")
    by_key = {t.key: t for t in tables.sections}
    cells_table = by_key.get("cells")
    compared = {c.index for col in h.columns for c in col.cells}
    legend = LEGEND.format(legend=report_tensors.legend(c.data for c in cells))
    grids = op_answers(tables)
    body = [answers_html(grids, names), _headline(h, names, legend),
            *(_table(t, ids) for t in tables.sections
                                            if t.key == "versions"),
            _plots(plots or {}), _not_run(cells)]
    if cells_table is not None:
        rows = [r for r in cells_table.rows if r.cell in compared]
        body.append(_table(Table("cells", "Cells with comparisons", cells_table.headers, rows,
                                 note="Each cell's tables (bitwise, accuracy, timings, "
                                      "environment) are on its page: `cells/<cell>.md`; all "
                                      "of them: `cells/README.md`.",
                                 empty="No cell has comparisons."), ids))
    body.append(_across(tables, ids))
    body += [_table(t, ids) for t in tables.sections
             if t.key.startswith("bench") or t.key == "unreadable"]
    stale = [c for c in cells if c.ours and staleness(c, tables.head)]
    head = tables.head[:12] if tables.head else "unknown"
    data = _script_json({"cells": [_facets(c) for c in cells],
                         "columns": [{"gpu": c.gpu, "stack": c.stack, "mode": c.mode}
                                     for c in h.columns],
                         "gcolumns": grid_columns(grids)})
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(tables.title())}</title>",
        f"<style>\n{_asset('report.css')}</style></head><body>",
        f"<header><h1>{_e(tables.title())}</h1>",
        f'<p class="summary">{_inline(tables.summary_line())} Current commit <code>{_e(head)}'
        f"</code>: {len(stale)} of {sum(c.ours for c in cells)} of our reports made at "
        "another commit or from a dirty tree (⚠).</p>",
        '<p class="gen">Generated by <code>nox -s report</code> from the JSON reports in this '
        'directory; do not edit. Markdown: <a href="README.md">README.md</a>, every cell: '
        '<a href="cells/README.md">cells/README.md</a>; for tools: '
        '<a href="summary.csv">summary.csv</a>, <a href="summary.json">summary.json</a>.</p>',
        "</header>",
        _filters(cells, h),
        "<main>", *body, "</main>",
        f'<script type="application/json" id="cells-data">{data}</script>',
        f"<script>\n{_asset('report.js')}</script>",
        "</body></html>", ""])
