"""The table model the renderers share: a :class:`Table` of :class:`Row` values.

Each module of :mod:`runner.tables.model` builds its tables as these (display strings, see
:mod:`runner.tables.model.values`); the renderers (:mod:`runner.tables.render`) only lay them
out, as Markdown, HTML or CSV/JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Row", "Table"]


@dataclass(frozen=True)
class Row:
    """One table row: display strings, the cell it belongs to (for the HTML filters; None
    for a row about several cells) and an optional colour class per value."""

    values: tuple[str, ...]
    cell: int | None = None
    kinds: tuple[str, ...] = ()


@dataclass
class Table:
    """A titled table shared by the Markdown and HTML renderers.

    ``note`` is a paragraph above the table and ``footer`` one below (plain text with
    ``code`` spans in backticks); ``empty`` replaces the table when there are no rows.

    Example:
        >>> Table("cells", "Cells", ("cell", "status"), [Row(("host-plain-cpu", "ok"), 0)])
    """

    key: str
    title: str
    headers: tuple[str, ...]
    rows: list[Row] = field(default_factory=list)
    note: str = ""
    empty: str = "Nothing to show."
    footer: str = ""
    level: int = 2
