"""How a report value reads in a table: one line of text, numbers, times, CMPs, colour classes.

Every table of :mod:`runner.tables.model` is made of display strings (:class:`~runner.tables.
model.table.Row`); these functions make them, so the Markdown, HTML and summary renderers show
the same value the same way. :data:`ABSENT` stands for a value the report does not have.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gate_residual_matrix.runner.status import Status

__all__ = ["ABSENT", "STATUSES", "cmp_kind", "format_cmp", "ms", "num", "short", "status_kind",
           "text"]

ABSENT = "—"
"""Shown for a tensor or value the report does not have."""

STATUSES = tuple(s.value for s in Status if s is not Status.PARTIAL)
"""Cell statuses in the order the summaries count them (docs/report-format.md)."""

_BAD = {s.value for s in Status if s.failed}
_MAX_REASON = 200


def text(value: Any) -> str:
    """A table value on one line (runs of whitespace become one space)."""
    return " ".join(str(value).split())


def short(value: Any, limit: int = _MAX_REASON) -> str:
    """:func:`text` of ``value``, cut to ``limit`` characters with ``…`` (a reason, an error).

    Example:
        >>> short("a  long reason", 6)
        'a lon…'
    """
    line = text(value)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def num(value: Any) -> str:
    """``:g`` for numbers, ``"inf"`` as is, :data:`ABSENT` for None/missing.

    Example:
        >>> num(0.0078125), num(None), num("inf")
        ('0.0078125', '—', 'inf')
    """
    if value is None:
        return ABSENT
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, (int, float)):
        return f"{value:g}"
    return text(value)


def ms(value: Any) -> str:
    """A time in milliseconds to 4 significant digits, :data:`ABSENT` when not a number."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return f"{value:.4g}" if ok else ABSENT


def format_cmp(cmp: Mapping[str, Any] | None) -> str:
    """One CMP (docs/report-format.md) as a table value.

    Example:
        >>> format_cmp({"equal": False, "differ": 46978, "numel": 48384, "max_abs": 32.0})
        '46978/48384 (32, -)'
    """
    if cmp is None:
        return ABSENT
    if cmp.get("equal"):
        return "equal"
    ulp = cmp.get("max_ulp")
    parts = [num(cmp.get("max_abs")), "-" if ulp is None else str(ulp)]
    if cmp.get("nan_differ"):
        parts.append(f"nan {cmp['nan_differ']}")
    return f"{cmp.get('differ')}/{cmp.get('numel')} ({', '.join(parts)})"


def cmp_kind(cmp: Mapping[str, Any] | None) -> str:
    """The colour class of a CMP: ``eq``, ``diff`` or ``absent``."""
    if cmp is None:
        return "absent"
    return "eq" if cmp.get("equal") else "diff"


def status_kind(status: str) -> str:
    """The colour class of a cell or implementation status."""
    if status == "ok":
        return "ok"
    if status in _BAD:
        return "bad"
    if status == "mismatch":
        return "warn"
    return "skip" if status in ("skipped", "unavailable") else ""
