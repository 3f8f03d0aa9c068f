"""The headline's answer in Markdown and HTML: each op's sentence, then its grid
(:mod:`runner.tables.model.answers`, :mod:`runner.tables.model.sentence`).

The sentences come first, all of them, so one screen holds every op's answer; then per op a
grid of at most :data:`HTML_COLUMNS` columns a table in the page (a fixed layout at the page's
width: it never scrolls sideways) and, in Markdown, as many as fit
:data:`runner.tables.render.markdown.LINE` characters a line, columns named by letter with a
key below. Under each grid: the cell pages it sums up and, per report, why one is marked ⚠.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

from gate_residual_matrix.runner.tables.model.answers import OpGrid, ulp
from gate_residual_matrix.runner.tables.model.values import ABSENT
from gate_residual_matrix.runner.tables.render.markdown import fitted_tables, md_text

__all__ = ["GRID_LEGEND", "HTML_COLUMNS", "answers_html", "answers_markdown"]

HTML_COLUMNS = 6
"""Grid columns per table in the page, beside the pair column."""
GRID_LEGEND = (
    "Each grid: one row per pair of the op, one column per GPU × stack × the modes whose marks "
    "are all the same (named in the column). A mark reads as in the full table; after `·` each "
    "side's largest error against fp64 in ULP (`candidate | baseline`, over the tensors and "
    "cases where they differ; one number where the bits are the same; the largest over the "
    "column's modes); the closer side in bold. ⚠: one of the reports the mark sums up was not "
    "made at the current commit, was made from a dirty tree, or is not ok; each is named under "
    "its grid.")
"""How to read a grid (Markdown; the page renders the code spans)."""


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _letter(n: int) -> str:
    return chr(ord("A") + n) if n < 26 else f"C{n}"


def _header(grid: OpGrid, n: int) -> str:
    c = grid.columns[n]
    return f"{c.gpu} · {c.stack} · {', '.join(c.modes)}"


def _md_mark(grid: OpGrid, pair: str, n: int) -> str:
    m = grid.marks.get((pair, n))
    if m is None:
        return ABSENT
    text = md_text(m.text())
    closer = m.closer()
    if closer is not None and m.mark.differ:
        a, b = (ulp(e) for e in m.errors())
        shown = [a, b]
        shown[closer] = f"**{shown[closer]}**"
        text = text.replace(f"{a} \\| {b}", " \\| ".join(shown), 1)
    return text


def _pages(grid: OpGrid, names: Mapping[int, str], prefix: str) -> list[tuple[str, str]]:
    cells = {c.index: c for col in grid.columns for c in col.cells}
    return [(cells[i].label, f"{prefix}{names[i]}") for i in sorted(cells) if i in names]


def answers_markdown(grids: Sequence[OpGrid], names: Mapping[int, str],
                     prefix: str = "cells/") -> str:
    """The sentences, then each op's grid, as Markdown (``names``: cell index -> page name
    under ``prefix``)."""
    if not grids:
        return "_No cell has comparisons yet._\n"
    parts = ["\n".join(f"- **{md_text(g.op)}** {md_text(g.sentence[len(g.op):])}"
                       for g in grids) + "\n", GRID_LEGEND + "\n"]
    for grid in grids:
        parts.append(f"### {md_text(grid.op)}\n")
        columns = [(_letter(n), [_md_mark(grid, p, n) for p in grid.pairs])
                   for n in range(len(grid.columns))]
        parts += [t + "\n" for t in fitted_tables("pair", [md_text(p) for p in grid.pairs],
                                                  columns)]
        parts.append("Columns: " + "; ".join(f"**{_letter(n)}** {md_text(_header(grid, n))}"
                                             for n in range(len(grid.columns))) + ".\n")
        parts.append("Cell pages: " + ", ".join(f"[{md_text(label)}]({link})" for label, link
                                                in _pages(grid, names, prefix)) + ".\n")
        if grid.warnings:
            parts.append("⚠ " + "; ".join(f"{md_text(label)}: {md_text(why)}"
                                          for label, why in grid.warnings) + ".\n")
    return "\n".join(parts)


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
