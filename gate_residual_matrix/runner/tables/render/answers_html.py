"""Each op's sentence and grid in the HTML page (:mod:`runner.tables.model.answers` builds
them; :mod:`.answers` writes the Markdown)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

from gate_residual_matrix.runner.tables.model.answers import GRID_LEGEND, OpGrid, ulp
from gate_residual_matrix.runner.tables.model.values import ABSENT

__all__ = ["HTML_COLUMNS", "answers_html", "grid_columns"]

HTML_COLUMNS = 6
"""Grid columns per table in the page, beside the pair column."""


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _html_mark(grid: OpGrid, pair: str, n: int, names: Mapping[int, str]) -> str:
    m = grid.marks.get((pair, n))
    if m is None:
        return f'<td data-gcol="{grid.op}/{n}" class="k-absent">{ABSENT}</td>'
    label = _e(m.mark.label())
    cell = m.mark.only_cell
    if m.mark.compared and cell is not None and cell in names:
        label = f'<a href="cells/{_e(names[cell])}">{label}</a>'
    errors = m.errors() if m.mark.compared else (None, None)
    shown = [f"{_e(ulp(e))}" for e in errors]
    closer = m.closer()
    if closer is not None and m.mark.differ:
        shown[closer] = f"<b>{shown[closer]}</b>"
    err = m.error_text() and (shown[0] if not m.mark.differ else " | ".join(shown))
    warn = (f' <span class="stale" title="{_e("; ".join(m.warnings))}">⚠</span>'
            if m.warnings else "")
    return (f'<td data-gcol="{grid.op}/{n}" class="k-{m.mark.kind()}">{label}'
            + (f'<span class="err"> · {err}</span>' if err else "") + warn + "</td>")


def _html_grid(grid: OpGrid, names: Mapping[int, str]) -> list[str]:
    out = [f'<section id="grid-{_e(grid.op)}" class="grid"><h3>{_e(grid.op)}</h3>']
    for start in range(0, len(grid.columns), HTML_COLUMNS):
        chunk = list(range(start, min(start + HTML_COLUMNS, len(grid.columns))))
        out.append('<div class="gridbox"><table class="data grid"><colgroup>'
                   '<col class="pair">' + "<col>" * len(chunk) + '</colgroup><thead><tr>'
                   '<th class="pair">pair</th>')
        for n in chunk:
            c = grid.columns[n]
            out.append(f'<th data-gcol="{grid.op}/{n}"><span class="gpu">{_e(c.gpu)}</span><br>'
                       f'{_e(c.stack)}<br><span class="mode">{_e(", ".join(c.modes))}</span></th>')
        out.append("</tr></thead><tbody>")
        for pair in grid.pairs:
            if not any((pair, n) in grid.marks for n in chunk):
                continue
            out.append(f'<tr data-pair="{_e(pair)}"><th class="pair">{_e(pair)}</th>'
                       + "".join(_html_mark(grid, pair, n, names) for n in chunk) + "</tr>")
        out.append("</tbody></table></div>")
    if grid.warnings:
        out.append('<p class="note">⚠ ' + _e("; ".join(f"{label}: {why}"
                                                      for label, why in grid.warnings))
                   + ".</p>")
    out.append("</section>")
    return out


def answers_html(grids: Sequence[OpGrid], names: Mapping[int, str]) -> str:
    """The sentences (``#answers``, one ``li`` per op) and the grids, as HTML."""
    out = ['<section id="answers" class="level2"><h2>Can I swap A for B?</h2>']
    if not grids:
        return "\n".join([*out, '<p class="empty">No cell has comparisons yet.</p></section>'])
    out.append('<ul class="answers">' + "".join(
        f'<li data-op="{_e(g.op)}"><a href="#grid-{_e(g.op)}"><b>{_e(g.op)}</b></a>'
        f" {_e(g.sentence[len(g.op):].strip())}</li>" for g in grids) + "</ul>")
    legend = "".join(f"<code>{p}</code>" if i % 2 else p
                     for i, p in enumerate(_e(GRID_LEGEND).split("`")))
    out.append(f'<details class="legend"><summary>How to read the grids</summary><p>{legend}'
               "</p></details>")
    for grid in grids:
        out += _html_grid(grid, names)
    out.append("</section>")
    return "\n".join(out)


def grid_columns(grids: Sequence[OpGrid]) -> dict[str, dict[str, str]]:
    """``"<op>/<n>"`` -> the column's facets (gpu, stack, mode) for the page's filters."""
    return {f"{g.op}/{n}": {"gpu": c.gpu, "stack": c.stack, "mode": ", ".join(c.modes)}
            for g in grids for n, c in enumerate(g.columns)}
