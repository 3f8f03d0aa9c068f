"""The output formats, by name: each renders built tables into its files.

:data:`FORMATS` is the one table of them, in the order :func:`runner.tables.write_tables`
writes them (``markdown``: ``README.md``, the cell pages and ``ab.md``; ``html``:
``index.html``; ``csv``: ``summary.csv``; ``json``: ``summary.json``; ``plots``:
``plots/*.svg``). A caller picks formats by name (:func:`select`); a new format is one more
entry here and one renderer under ``render/``.

Example:
    >>> [f.name for f in select(["html", "csv"])]
    ['html', 'csv']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gate_residual_matrix.runner.errors import SelectionError
from gate_residual_matrix.runner.tables.model.build import Tables
from gate_residual_matrix.runner.tables.render import html, pages, summary

__all__ = ["FORMATS", "Format", "Rendering", "select"]


@dataclass(frozen=True)
class Rendering:
    """What every format renders from: the built tables, the plots (name -> (caption, svg)),
    the headline's level (:func:`runner.tables.model.headline.choose_level`) and ``out``,
    the Markdown file (its folder holds every output)."""

    tables: Tables
    figures: dict
    headline: object
    out: Path


@dataclass(frozen=True)
class Format:
    """One output format. ``render(rendering)`` gives path -> text, in writing order.
    ``folder``: the subfolder it writes pages into (made first), whose earlier ``*sweep``
    files that this run did not write are removed; ``stale(rendering)``: files of this
    format that this run does not write and that are removed if present."""

    name: str
    render: Callable[[Rendering], dict[Path, str]]
    folder: str | None = None
    sweep: str | None = None
    stale: Callable[[Rendering], list[Path]] = lambda r: []


def _markdown(r: Rendering) -> dict[Path, str]:
    """``README.md`` (at ``out``), the cell pages and ``ab.md``: README last, as written."""
    texts = {r.out.parent / name: text
             for name, text in pages.markdown_pages(r.tables, r.figures).items()}
    texts[r.out] = texts.pop(r.out.parent / "README.md")
    return texts


def _no_ab(r: Rendering) -> list[Path]:
    """``ab.md`` when no A/B is shown."""
    return [] if r.tables.ab else [r.out.parent / "ab.md"]


def _html(r: Rendering) -> dict[Path, str]:
    return {r.out.parent / "index.html": html.render_html(r.tables, r.figures, r.headline)}


def _csv(r: Rendering) -> dict[Path, str]:
    return {r.out.parent / "summary.csv": summary.render_csv(r.tables)}


def _json(r: Rendering) -> dict[Path, str]:
    return {r.out.parent / "summary.json": summary.render_json(r.tables)}


def _plots(r: Rendering) -> dict[Path, str]:
    return {r.out.parent / "plots" / name: svg for name, (_, svg) in r.figures.items()}


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("markdown", _markdown, folder="cells", sweep=".md", stale=_no_ab),
    Format("html", _html),
    Format("csv", _csv),
    Format("json", _json),
    Format("plots", _plots, folder="plots", sweep=".svg"),
)}
"""Every output format by name, in writing order."""


def select(names: Iterable[str] | None = None) -> list[Format]:
    """The formats named (every one when ``names`` is None), in :data:`FORMATS`' order.

    Raises :class:`runner.errors.SelectionError` for a name not in :data:`FORMATS`, listing
    the known ones.
    """
    if names is None:
        return list(FORMATS.values())
    wanted = list(names)
    unknown = [n for n in wanted if n not in FORMATS]
    if unknown:
        raise SelectionError(f"output format {', '.join(map(repr, unknown))}: expected one of "
                             f"{', '.join(FORMATS)}")
    return [f for name, f in FORMATS.items() if name in wanted]
