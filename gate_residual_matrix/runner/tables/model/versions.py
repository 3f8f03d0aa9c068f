"""The first change across versions: for a library implementation that ran in several versions
in one cell (``sglang_indexed_gate_triton-0.5.21``, ``-0.5.22``, ``-0.5.23``), the first
version whose bits differ from its predecessor's.

Within one cell only the library version differs between those rows (same GPU, torch, triton,
mode, inputs), so a change of bits is the library's. Versions are ordered by
:class:`packaging.version.Version`; a version without bits (unavailable, failed) is passed
over, and the next one is compared with the last that had bits. Two versions are compared on
every (case, tensor) both have a sha256 for (``results[impl].sha256[case][tensor]``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from gate_residual_matrix import ops
from gate_residual_matrix.runner.reports import tensors as report_tensors
from gate_residual_matrix.runner.tables.model.cells import CellReport
from gate_residual_matrix.runner.tables.model.filters import Filters
from gate_residual_matrix.runner.tables.model.table import Row, Table
from gate_residual_matrix.runner.tables.model.values import ABSENT

__all__ = ["FirstChange", "first_change_text", "first_changes", "library_row", "versions_table"]

_MAX_CELLS = 12
_ROW = re.compile(r"^(?P<stem>.+)-(?P<version>\d[0-9A-Za-z.+!]*)$")


def library_row(name: str) -> tuple[str, Version] | None:
    """(implementation, version) of a library row named ``<implementation>-<version>``
    (contract/versioned.py), else None.

    Example:
        >>> library_row("vllm_omni_h3_fused-0.30.0")
        ('vllm_omni_h3_fused', <Version('0.30.0')>)
    """
    found = _ROW.match(name)
    if not found:
        return None
    try:
        return found["stem"], Version(found["version"])
    except InvalidVersion:
        return None


@dataclass(frozen=True)
class FirstChange:
    """One library implementation in one cell: its ``versions`` with bits, in order, and the
    first whose bits differ from its predecessor's (``version``, None when none does), with
    the tensors (labels) and the cases where they differ, of ``compared`` common cases."""

    stem: str
    versions: tuple[str, ...]
    version: str | None
    previous: str | None
    tensors: tuple[str, ...]
    cases: tuple[str, ...]
    compared: int

    def text(self) -> str:
        """``0.30.0 (out in 30 of 30 cases vs 0.28.0)`` or ``none: 0.5.21, 0.5.22, 0.5.23 have
        the same bits (10 cases)``."""
        if self.version is None:
            return (f"none: {', '.join(self.versions)} have the same bits "
                    f"({self.compared} cases)")
        return (f"{self.version} ({', '.join(self.tensors)} in {len(self.cases)} of "
                f"{self.compared} cases vs {self.previous})")


def _differing(a: Mapping[str, Any], b: Mapping[str, Any],
               names: Mapping[str, str]) -> tuple[int, list[str], list[str]]:
    """(common cases, labels of the tensors that differ in the op's order, cases where one
    does) of two sha256 maps."""
    cases = [c for c in a if c in b]
    moved: set[str] = set()
    differ = []
    for case in cases:
        sa, sb = a[case] or {}, b[case] or {}
        here = {t for t in sa if t in sb and sa[t] != sb[t]}
        if here:
            differ.append(case)
            moved |= here
    ordered = [t for t in names if t in moved] + sorted(moved - set(names))
    return len(cases), [names.get(t, t) for t in ordered], differ


def first_changes(cell: CellReport) -> dict[str, FirstChange]:
    """Per library implementation with at least two versions with bits in ``cell``: its
    :class:`FirstChange`.

    Example:
        >>> first_changes(cell)["vllm_omni_h3_fused"].text()
        '0.30.0 (out in 20 of 30 cases vs 0.28.0)'
    """
    key = ("first_changes",)
    if key in cell.memo:
        return cell.memo[key]
    rows: dict[str, list[tuple[Version, str]]] = {}
    for impl, entry in cell.results.items():
        parsed = library_row(impl)
        if parsed and isinstance(entry, Mapping) and entry.get("sha256"):
            rows.setdefault(parsed[0], []).append((parsed[1], impl))
    names = report_tensors.labels(cell.data)
    out = {}
    for stem, versions in rows.items():
        if len(versions) < 2:
            continue
        ordered = sorted(versions)
        shas = [cell.results[impl]["sha256"] for _, impl in ordered]
        shown = tuple(str(v) for v, _ in ordered)
        found = FirstChange(stem, shown, None, None, (), (), 0)
        compared = 0
        for k in range(1, len(ordered)):
            common, tensors, cases = _differing(shas[k - 1], shas[k], names)
            compared = max(compared, common)
            if cases:
                found = FirstChange(stem, shown, shown[k], shown[k - 1], tuple(tensors),
                                    tuple(cases), common)
                break
        out[stem] = found if found.version else FirstChange(stem, shown, None, None, (), (),
                                                            compared)
    cell.memo[key] = out
    return out


def first_change_text(cell: CellReport, impl: str) -> str:
    """The first change of ``impl``'s library implementation in ``cell`` as the tables show
    it; :data:`ABSENT` when ``impl`` is not a library row or fewer than two of its versions
    have bits there."""
    parsed = library_row(impl)
    found = first_changes(cell).get(parsed[0]) if parsed else None
    return found.text() if found else ABSENT


def versions_table(cells: Sequence[CellReport], filters: Filters | None = None) -> Table:
    """One row per library implementation, versions and first change, with the cells where
    that is so (the modes of one GPU usually agree): ``vllm_omni_h3_fused | 0.28.0, 0.30.0 |
    0.30.0 (out in 20 of 30 cases vs 0.28.0) | host-plain-cuda, ...``. Empty when no cell ran
    two versions of one implementation."""
    filters = filters or Filters()
    groups: dict[tuple[str, str, str], list[str]] = {}
    for cell in cells:
        for stem, found in first_changes(cell).items():
            if not any(filters.keeps_impl(f"{stem}-{v}") for v in found.versions):
                continue
            name = stem + (f" ({cell.op})" if cell.op and cell.op != ops.OPS[0] else "")
            groups.setdefault((name, ", ".join(found.versions), found.text()), []).append(
                cell.label)
    rows = [Row((name, versions, text, ", ".join(labels[:_MAX_CELLS])
                 + (f" and {len(labels) - _MAX_CELLS} more" if len(labels) > _MAX_CELLS
                    else "")), None, ("", "", "diff" if not text.startswith("none") else "eq"))
            for (name, versions, text), labels in groups.items()]
    return Table(
        "versions", "First change across library versions",
        ("implementation", "versions", "first change", "cells"), rows,
        note="Where a cell ran several versions of one library implementation (rows "
             "`<implementation>-<version>`, same GPU, torch and inputs), the first version "
             "whose bits (the sha256 of every tensor in every case both ran) differ from the "
             "previous version's, with the tensors and cases; `none` when every version has "
             "the same bits. Each cell's library rows table repeats it per row.",
        empty="No cell ran two versions of one library implementation.")
