"""Render the tables as ``reports/index.html``: one self-contained page, no network assets.

The page holds, in order: the summary, filters by stack, mode, GPU and dtype (client-side:
checkboxes, "only" buttons, "show all"), a heatmap of pair x case x tensor per cell and dtype
(green: equal bits; red, darker with the share of differing elements; grey: absent), the
identical-bits tables as a matrix of cells (one column per cell, a letter per group of
identical sha256; the verdict is recomputed for the cells shown), then every other table of
:mod:`runner.tables` with colour for equal/differ and status.

CSS and JavaScript live in ``runner/assets/`` and are inlined; the cells' facets are embedded
as JSON (a cell's ``dtype`` is the list of its cases' dtypes). Rows and columns that belong to
one cell carry ``data-cell="<index>"``, rows about one dtype ``data-dtype="<dtype>"`` (a
case's own: a table's ``dtype`` column, a heatmap row, a problem of the identical-bits
tables); the script hides those whose cell or dtype the filters leave out. Everything else is
rendered here, so the page reads the same with scripts off (unfiltered).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.aggregate import ABSENT, Cell, Table, num, status_kind, text
from runner.report import TENSORS
from runner.table_bits import NOTHING_TO_COMPARE, AcrossRow, format_count, pair_results
from runner.table_cases import DTYPE_NAMES, base_case, case_dtypes, cell_dtypes, dtype_label

if TYPE_CHECKING:
    from runner.tables import Tables

__all__ = ["FILTER_FACETS", "render_html"]

ASSETS = Path(__file__).resolve().parent / "assets"
FILTER_FACETS = ("stack", "mode", "gpu", "dtype")
"""The facets the page filters on, in the order of its controls."""

_TITLE = "gate_residual reproducibility matrix"
_BINS = (1e-3, 1e-2, 1e-1, 0.5)
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_PALETTE = 8
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


def _facets(cell: Cell) -> dict[str, Any]:
    """The cell's filter values; ``dtype`` is the list of its cases' dtypes."""
    out: dict[str, Any] = {f: cell.facet(f) for f in FILTER_FACETS}
    out["dtype"] = cell_dtypes(cell) or [ABSENT]
    return out


def _badge(cell: Cell) -> str:
    status = cell.status if cell.ours else "foreign"
    return f'<span class="badge st-{status_kind(status) or "none"}">{_e(status)}</span>'


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


def _heat_class(cmp: dict[str, Any] | None) -> str:
    if cmp is None:
        return "hx"
    if cmp.get("equal"):
        return "h0"
    numel = cmp.get("numel") or 0
    share = (cmp.get("differ") or 0) / numel if numel else 1.0
    return f"h{1 + sum(share >= b for b in _BINS)}"


def _heat_tip(cmp: dict[str, Any] | None) -> str:
    """``35088/48384 differ, max |a−b| 0.375, 31258 ULP apart`` (``equal``, ``—``)."""
    if cmp is None or cmp.get("equal"):
        return format_count(cmp)
    ulp = cmp.get("max_ulp")
    return (f"{format_count(cmp)} differ, max |a−b| {num(cmp.get('max_abs'))}, "
            f"{'-' if ulp is None else ulp} ULP apart")


def _heatmap(cells: Sequence[Cell], filters: Any) -> str:
    results = {c.index: pair_results(c, filters) for c in cells}
    cases = list(dict.fromkeys(base_case(r.case) for rs in results.values() for r in rs))
    ncols = len(cases) * len(TENSORS)
    out = ['<section id="heatmap" class="level2"><h2>Heatmap: pair × case × tensor</h2>',
           '<p class="note">One row per cell, implementation pair and dtypes (storage/index), '
           'one square per case and tensor; hover for the figures. <span class="legend">'
           '<span class="h h0"></span> equal bits <span class="h h1"></span><span class="h h2">'
           '</span><span class="h h3"></span><span class="h h4"></span><span class="h h5"></span>'
           ' bits differ in &lt;0.1%, &lt;1%, &lt;10%, &lt;50%, ≥50% of elements '
           '<span class="h hx"></span> absent (no backward) '
           '<span class="h hn"></span> case not run</span></p>']
    if not cells:
        return "\n".join([*out, '<p class="empty">No reports.</p></section>'])
    out.append('<p class="count" id="count-t-heat"></p>')
    out.append('<div class="scroll"><table class="heat data" id="t-heat"><thead><tr>'
               '<th rowspan="2">cell</th><th rowspan="2">pair</th>')
    out += [f'<th colspan="{len(TENSORS)}" class="case">{_e(c)}</th>' for c in cases]
    out.append("</tr><tr>" + "".join(f'<th class="tensor">{t}</th>' for _ in cases
                                     for t in TENSORS) + "</tr></thead><tbody>")
    for cell in cells:
        head = f'<th class="cellname">{_e(cell.label)} {_badge(cell)}</th>'
        rows = results[cell.index]
        if not rows:
            reason = text(cell.reason) if cell.reason else "no comparisons"
            out.append(f'<tr data-cell="{cell.index}">{head}<td>{ABSENT}</td>'
                       f'<td colspan="{ncols}" class="nopairs">{_e(reason)}</td></tr>')
            continue
        by_pair: dict[tuple[str, str], dict[str, tuple[str, dict[str, Any]]]] = {}
        for r in rows:
            key = (r.pair, dtype_label(cell, r.case))
            by_pair.setdefault(key, {})[base_case(r.case)] = (r.case, r.tensors)
        for (pair, dtypes), by_case in by_pair.items():
            tds = []
            for case in cases:
                for tensor in TENSORS:
                    if case not in by_case:
                        tds.append('<td class="h hn" title="case not run"></td>')
                        continue
                    own, tensors = by_case[case]
                    cmp = tensors.get(tensor)
                    tip = f"{cell.label} · {pair} · {own} · {tensor}: {_heat_tip(cmp)}"
                    tds.append(f'<td class="h {_heat_class(cmp)}" title="{_e(tip)}"></td>')
            dtype = case_dtypes(cell, next(iter(by_case.values()))[0])[0]
            shown = "" if dtypes == ABSENT else f" <span class=\"dt\">{_e(dtypes)}</span>"
            out.append(f'<tr data-cell="{cell.index}"{_attr_dtype(dtype)}>{head}'
                       f'<td class="pair">{_e(pair)}{shown}</td>' + "".join(tds) + "</tr>")
    out.append("</tbody></table></div></section>")
    return "\n".join(out)


def _matrix(title: str, key: str, rows: Sequence[AcrossRow], cells: Sequence[Cell],
            inputs: bool) -> str:
    """Across-cells rows as a matrix: one column per cell with bits, a group letter each."""
    members = sorted({i for r in rows for _, m in r.groups for i in m})
    out = [f'<section id="{key}" class="level3"><h3>{_e(title)}</h3>']
    if not rows:
        return "\n".join([*out, f'<p class="empty">{NOTHING_TO_COMPARE}</p></section>'])
    lead = ("problem", "case", "differing") if inputs else ("problem", "impl", "case", "tensor")
    if not inputs:
        out.append('<p class="toggle"><label><input type="checkbox" class="only-variants" '
                   f'data-table="t-{key}"> only rows where the bits differ or are void</label></p>')
    out.append(f'<p class="count" id="count-t-{key}"></p>')
    out.append(f'<div class="scroll"><table class="data matrix" id="t-{key}"><thead><tr>'
               + "".join(f"<th>{h}</th>" for h in (*lead, "verdict"))
               + "".join(f'<th class="vert"{_attr_cell(i)}><span>{_e(cells[i].label)}</span></th>'
                         for i in members) + "</tr></thead><tbody>")
    for r in rows:
        group_of = {i: n for n, (_, m) in enumerate(r.groups) for i in m}
        shas = {n: sha for n, (sha, _) in enumerate(r.groups)}
        lead_values = ((r.problem, r.case, r.tensor if r.void else "") if inputs
                       else (r.problem, r.impl, r.case, r.tensor))
        verdict = r.verdict() if (r.void or not inputs or r.count == 1) else "agree"
        tds = []
        for i in members:
            n = group_of.get(i)
            if n is None:
                tds.append(f'<td class="g"{_attr_cell(i)}></td>')
                continue
            letter = _LETTERS[n % len(_LETTERS)]
            tip = f"{cells[i].label}: group {letter}, sha256 {shas[n][:16]}…"
            tds.append(f'<td class="g g{n % _PALETTE}" data-g="{letter}"{_attr_cell(i)} '
                       f'title="{_e(tip)}">{letter}</td>')
        kind = r.kind() if (r.void or not inputs) else "eq"
        static = ' data-static="1"' if inputs else ""
        out.append(f'<tr data-across="1" data-void="{int(r.void)}"{_attr_dtype(r.dtype)}>'
                   + "".join(f"<td>{_e(v)}</td>" for v in lead_values)
                   + f'<td class="verdict k-{kind or "none"}"{static}>{_e(verdict)}</td>'
                   + "".join(tds) + "</tr>")
    out.append("</tbody></table></div></section>")
    return "\n".join(out)


def _filters(cells: Sequence[Cell]) -> str:
    out = ['<form id="filters" class="filters" onsubmit="return false">']
    facets = [_facets(c) for c in cells]
    for facet in FILTER_FACETS:
        values: dict[str, int] = {}
        for found in facets:
            for value in found[facet] if isinstance(found[facet], list) else [found[facet]]:
                values[value] = values.get(value, 0) + 1
        out.append(f'<fieldset data-dim="{facet}"><legend>{"GPU" if facet == "gpu" else facet}'
                   "</legend>")
        for value, count in values.items():
            shown = "(none)" if value == ABSENT else value
            out.append(f'<span class="opt"><label><input type="checkbox" data-dim="{facet}" '
                       f'value="{_e(value)}" checked> {_e(shown)} <span class="n">{count}</span>'
                       f'</label><button type="button" class="only" data-dim="{facet}" '
                       f'value="{_e(value)}" title="show only {_e(shown)}">only</button></span>')
        out.append("</fieldset>")
    out.append('<button type="button" id="reset">Show all</button>'
               '<output id="shown" aria-live="polite"></output></form>')
    return "\n".join(out)


def _nav(sections: Iterable[tuple[str, str]]) -> str:
    links = " · ".join(f'<a href="#{key}">{_e(title)}</a>' for key, title in sections)
    return f'<nav class="contents">{links}</nav>'


def _asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


def render_html(tables: Tables) -> str:
    """The page for built tables (:func:`runner.tables.build_tables`), as one string.

    Example:
        >>> page = render_html(build_tables(read_reports(Path("reports"))))
        >>> page.startswith("<!DOCTYPE html>") and "http" not in page.split("<body>")[0]
        True
    """
    cells = tables.cells
    ids = _Ids()
    body = []
    nav = [("heatmap", "Heatmap")]
    for table in tables.sections:
        if table.key == "across-inputs":
            rows = tables.across.inputs if tables.across.comparable else []
            body.append(_matrix("Inputs", ids(table.key), rows, cells, True))
        elif table.key == "across-outputs":
            rows = tables.across.rows if tables.across.comparable else []
            body.append(_matrix("Outputs", ids(table.key), rows, cells, False))
            if table.footer:
                body.append(f'<p class="footer">{_inline(table.footer)}</p>')
        else:
            key = table.key
            body.append(_table(table, ids))
            if table.level <= 2:
                nav.append((key if ids.seen[key] == 1 else f"{key}-{ids.seen[key]}",
                            table.title))
    data = _script_json([_facets(c) for c in cells])
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_TITLE}</title>",
        f"<style>\n{_asset('report.css')}</style></head><body>",
        f"<header><h1>{_TITLE}</h1>",
        '<p class="gen">Generated by <code>nox -s report</code> (runner/tables.py, '
        "runner/html.py) from the JSON reports in this directory; do not edit by hand. "
        'The same tables in Markdown: <a href="README.md">README.md</a>; for other tools: '
        '<a href="summary.csv">summary.csv</a>, <a href="summary.json">summary.json</a>.</p>',
        f'<p class="summary">{_inline(tables.summary_line())}</p>',
        _nav(nav), "</header>",
        _filters(cells),
        "<main>", _heatmap(cells, tables.filters), *body, "</main>",
        f'<script type="application/json" id="cells-data">{data}</script>',
        f"<script>\n{_asset('report.js')}</script>",
        "</body></html>", ""])
