"""Where the outputs link: one Markdown page per cell under ``cells/``, named from its label.

Both the Markdown pages (:mod:`runner.tables.render.pages`) and the HTML page
(:mod:`runner.tables.render.html`) link a headline mark to its cell's page, so both take the
names from here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from gate_residual_matrix.runner.tables.model.cells import CellReport
from gate_residual_matrix.runner.tables.model.headline import Mark

__all__ = ["mark_link", "page_names"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def page_names(cells: Sequence[CellReport]) -> dict[int, str]:
    """A file name per cell (``host-plain-cuda.md``), unique, from its label.

    Example:
        >>> page_names(cells)[0]
        'host-plain-cuda.md'
    """
    names: dict[int, str] = {}
    seen: set[str] = set()
    for cell in cells:
        stem = _UNSAFE.sub("_", cell.label).strip("._-") or "cell"
        if stem.lower() == "readme":
            stem += "-cell"
        name, n = stem, 1
        while name.lower() in seen:
            n += 1
            name = f"{stem}-{n}"
        seen.add(name.lower())
        names[cell.index] = f"{name}.md"
    return names


def mark_link(mark: Mark, names: Mapping[int, str]) -> str:
    """The page a headline mark links to, from the reports directory: its own cell's page
    (a column may hold one cell of each op), or ``cells/README.md`` for a mark that sums up
    several cells (a merged column).

    Example:
        >>> mark_link(h.marks[("numba vs eager", 0)], page_names(cells))
        'cells/host-plain-cuda.md'
    """
    return "cells/README.md" if mark.only_cell is None else f"cells/{names[mark.only_cell]}"
