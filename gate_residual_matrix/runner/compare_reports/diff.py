"""Two report sets matched cell by cell, and every verdict that changed between them.

Cells match by op, stack, mode, target and GPU (``CPU`` for a cpu cell); within a matched
pair of cells, implementations match by name, and a library row whose version is in one set
only (``sglang_indexed_gate_triton-0.5.23`` before, ``-0.5.24`` after) is matched with the
other set's newest unmatched version of the same implementation, shown as ``-0.5.23→0.5.24``.
Cases match by id (ids carry their dtypes). What changed in the set-up (library versions,
torch, driver, commit) is listed beside each cell, from
:func:`runner.tables.model.cells.configuration`.

Each change is a :class:`Change` under one rule of :mod:`runner.compare_reports.rules`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version

from gate_residual_matrix.runner.compare_reports.facts import Bits, FactKey, facts
from gate_residual_matrix.runner.compare_reports.rules import Rules
from gate_residual_matrix.runner.errors import ConfigError
from gate_residual_matrix.runner.reports import tensors as report_tensors
from gate_residual_matrix.runner.reports.store import read_reports
from gate_residual_matrix.runner.tables import (
    ABSENT,
    CellReport,
    configuration,
    library_row,
    load_cells,
)

__all__ = ["Change", "Comparison", "ReportSet", "compare", "load_set"]

_TABLE_OUTPUTS = ("summary.json",)  # the tables' own JSON beside the reports: not a report
_SETUP_IGNORED = ("origin", "cases", "stack", "mode", "target", "op", "gpu")
CellKey = tuple[str, str, str, str, str]


@dataclass(frozen=True)
class ReportSet:
    """One directory of reports as ``compare`` reads it: our readable cells (foreign reports,
    the reference layout, have no stack or mode to match and are counted apart)."""

    directory: Path
    cells: list[CellReport]
    foreign: int = 0


def load_set(directory: Path, role: str, exclude: Path | None = None) -> ReportSet:
    """Read every report under ``directory`` (``role`` names it in errors: ``BASELINE_DIR``),
    but those under ``exclude`` (the other set, when it lies inside this one: ``compare
    reports/known-good reports``).

    Raises:
        ConfigError: no such directory; a file that is not a readable report (corrupt,
            truncated, invalid, a duplicate cell); no report of this runner (foreign ones
            only). One line, naming the first bad file and how many there are.
    """
    directory = Path(directory)
    if not directory.is_dir():
        found = "not a directory" if directory.exists() else "no such directory"
        raise ConfigError(f"{role}: expected a directory of reports, got {directory} ({found})")
    skip = {os.path.realpath(directory / name) for name in _TABLE_OUTPUTS}
    if exclude is not None and exclude.is_dir() and _inside(exclude, directory) and not (
            _inside(directory, exclude)):  # strictly inside: one directory is one set
        skip |= {os.path.realpath(p) for p in exclude.rglob("*.json")}
    reports = read_reports(directory, skip=skip)
    bad = [r for r in reports if not r.ok]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise ConfigError(f"{role}: {bad[0].path}: {bad[0].problem}{more}")
    cells = load_cells(reports)
    ours = [c for c in cells if c.ours]
    if not ours:
        what = (f"only {len(cells)} foreign report(s) (the reference layout names no stack or "
                "mode to match)") if cells else "no report"
        raise ConfigError(f"{role}: {directory}: {what}; nothing of this runner to compare")
    return ReportSet(directory, ours, len(cells) - len(ours))


def _inside(inner: Path, outer: Path) -> bool:
    """Whether ``inner`` is ``outer`` or lies below it (real paths)."""
    a, b = os.path.realpath(inner), os.path.realpath(outer)
    return a == b or a.startswith(b.rstrip(os.sep) + os.sep)


def cell_key(cell: CellReport) -> CellKey:
    """(op, stack, mode, target, GPU): what makes two reports the same cell."""
    gpu = "CPU" if cell.target == "cpu" else (cell.gpu or "no GPU")
    return (str(cell.op), str(cell.stack), str(cell.mode), str(cell.target), gpu)


@dataclass(frozen=True)
class Change:
    """One verdict that changed, in one cell, subject (pair or implementation), case and
    tensor (its label; ``""`` where the verdict is not per tensor)."""

    cell: str
    rule: str
    subject: str
    case: str
    tensor: str
    before: str
    after: str
    fails: bool
    unstable: bool = False

    @property
    def verdict(self) -> str:
        """``REGRESSED`` (its rule fails the comparison), ``unstable`` (a side was not
        repeatable, so the value moves from run to run: never gated unless the rules say
        ``gate_unstable``) or ``allowed``."""
        if self.unstable:
            return "unstable"
        return "REGRESSED" if self.fails else "allowed"


@dataclass
class Comparison:
    """What :func:`compare` found. ``setup`` holds, per matched cell, the set-up keys that
    differ (``library torch: 2.13.0 → 2.14.0``); ``renamed`` the library rows matched across
    versions; ``only_*`` cells, implementations and case counts present on one side only."""

    baseline: Path
    new: Path
    rules: Rules
    matched: list[str] = field(default_factory=list)
    only_baseline: list[str] = field(default_factory=list)
    only_new: list[str] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    setup: dict[str, list[str]] = field(default_factory=dict)
    renamed: dict[str, list[str]] = field(default_factory=dict)
    compared: dict[str, int] = field(default_factory=dict)  # cell -> case verdicts compared
    uncompared: dict[str, list[str]] = field(default_factory=dict)  # cell -> notes

    @property
    def regressions(self) -> list[Change]:
        """The changes that fail the comparison."""
        return [c for c in self.changes if c.verdict == "REGRESSED"]


def _match_versions(base: set[str], new: set[str]) -> dict[str, tuple[str, str]]:
    """Library rows of a version present on one side only, matched newest with newest per
    implementation: ``{shown name: (baseline name, new name)}``."""
    out = {}
    stems: dict[str, dict[str, list[tuple[Version, str]]]] = {}
    for side, names in (("base", base - new), ("new", new - base)):
        for name in names:
            if (parsed := library_row(name)) is not None:
                stems.setdefault(parsed[0], {}).setdefault(side, []).append((parsed[1], name))
    for stem, sides in stems.items():
        if "base" in sides and "new" in sides:
            (vb, b), (vn, n) = max(sides["base"]), max(sides["new"])
            out[f"{stem}-{vb}→{vn}"] = (b, n)
    return out


def _grew(before: float, after: float, tolerance: float) -> bool:
    if math.isinf(after) or math.isinf(before):
        return after > before
    return after > before * (1 + tolerance) and after > before


def _not_repeatable(*found: Mapping[FactKey, Any]) -> set[tuple[str, str, str]]:
    """(implementation, case, tensor) not repeatable in any of the sets, and (implementation,
    case, "") for each of those cases."""
    out = set()
    for fs in found:
        for (kind, impl, case, tensor), value in fs.items():
            if kind == "repeatable" and value is False:
                out |= {(impl, case, tensor), (impl, case, "")}
    return out


def _status_rule(kind: str, before: str, after: str) -> str | None:
    if before == after:
        return None
    if before == "ok":
        return f"{kind}:worse"
    return f"{kind}:better" if after == "ok" else None


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def _rule(kind: str, before: Any, after: Any, rules: Rules) -> tuple[str, str, str] | None:
    """(rule, before, after as text) when the fact changed, else None."""
    if kind == "bits":
        b, a = before, after
        assert isinstance(b, Bits) and isinstance(a, Bits)
        if b.state != a.state:
            return f"bits:{b.state}->{a.state}", b.describe(), a.describe()
        if b.state == "equal":
            return None
        if a.fraction > b.fraction + rules.fraction_tolerance:
            return "differ_fraction:grew", b.describe(), a.describe()
        if b.fraction > a.fraction + rules.fraction_tolerance:
            return "differ_fraction:shrank", b.describe(), a.describe()
        return None
    if kind in ("repeatable", "across_processes", "batch_invariant"):
        if before == after:
            return None
        return f"{kind}:{_yes(before)}->{_yes(after)}", _yes(before), _yes(after)
    if kind == "error":
        if _grew(before, after, rules.error_tolerance):
            return "error:grew", f"{before:.4g}", f"{after:.4g}"
        if _grew(after, before, rules.error_tolerance):
            return "error:shrank", f"{before:.4g}", f"{after:.4g}"
        return None
    if kind == "impl_status":
        rule = _status_rule("impl_status", before, after)
        return (rule, before, after) if rule else None
    raise AssertionError(kind)


def _diff_cells(b: CellReport, n: CellReport, rules: Rules, out: Comparison) -> None:
    label = n.label
    if "skipped" in (b.status, n.status):  # not run on one side: nothing to compare
        side = "the new set" if n.status == "skipped" else "the baseline"
        reason = (n if n.status == "skipped" else b).reason
        out.uncompared[label] = [f"skipped in {side}" + (f": {reason}" if reason else "")]
        rule = "cell_status:skipped" if b.status == "ok" else _status_rule(
            "cell_status", b.status, n.status)
        if rule and b.status != n.status:
            out.changes.append(Change(label, rule, "cell", "", "", b.status, n.status,
                                      rules.fails(rule)))
        return
    cb, cn = configuration(b), configuration(n)
    out.setup[label] = [f"{k}: {cb.get(k, ABSENT)} → {cn.get(k, ABSENT)}"
                        for k in dict.fromkeys([*cb, *cn])
                        if k not in _SETUP_IGNORED and cb.get(k, ABSENT) != cn.get(k, ABSENT)]
    rule = _status_rule("cell_status", b.status, n.status)
    if rule:
        out.changes.append(Change(label, rule, "cell", "", "", b.status, n.status,
                                  rules.fails(rule)))
    versions = _match_versions(set(b.results), set(n.results))
    out.renamed[label] = list(versions)
    to_shown = {name: shown for shown, pair in versions.items() for name in pair}
    fb = facts(b, lambda x: to_shown.get(x, x))
    fn = facts(n, lambda x: to_shown.get(x, x))
    names = {**report_tensors.labels(b.data), **report_tensors.labels(n.data)}
    void = set()
    for key in fb.keys() & fn.keys():
        if key[0] == "inputs" and fb[key] != fn[key]:
            void.add(key[2])
            out.changes.append(Change(label, "inputs:changed", "inputs", key[2], "",
                                      "sha256 as before", "other sha256",
                                      rules.fails("inputs:changed")))
    shaky = _not_repeatable(fb, fn)
    order = {c: i for i, c in enumerate(n.cases)}
    compared = 0
    for key in sorted(fb.keys() & fn.keys(),
                      key=lambda k: (k[1], order.get(k[2], len(order)), k[3], k[0])):
        kind, subject, case, tensor = key
        if kind == "inputs" or case in void:
            continue
        compared += bool(case)  # a per-case verdict: "no common cases" counts these
        found = _rule(kind, fb[key], fn[key], rules)
        if found is None:
            continue
        name, before, after = found
        sides = subject.split(" vs ") if kind == "bits" else [subject]
        unstable = (kind in ("bits", "error", "batch_invariant") and not rules.gate_unstable
                    and any((side, case, tensor) in shaky for side in sides))
        out.changes.append(Change(label, name, subject, case, names.get(tensor, tensor),
                                  before, after, rules.fails(name), unstable))
    out.compared[label] = compared
    notes = []
    gone = sorted({k[1] for k in fb.keys() - fn.keys() if k[0] == "impl_status"})
    if gone:
        notes.append("only in the baseline: " + ", ".join(gone))
    cases = [c for c in b.cases if c not in n.case_set]
    if cases:
        notes.append(f"{len(cases)} of {len(b.cases)} baseline cases not in the new report")
    out.uncompared[label] = notes


def compare(baseline: ReportSet, new: ReportSet, rules: Rules | None = None) -> Comparison:
    """Every verdict that changed from ``baseline`` to ``new``, each under its rule.

    Raises:
        ConfigError: no cell is in both sets, or the cells in both have no verdict in common
            (no common case, no status): nothing could be compared.

    Example:
        >>> c = compare(load_set(Path("old"), "BASELINE_DIR"), load_set(Path("reports"), "NEW"))
        >>> [(x.rule, x.subject, x.case, x.tensor) for x in c.regressions]
        [('bits:equal->differ', 'numba vs eager', '257', 'out')]
    """
    rules = rules or Rules()
    out = Comparison(baseline.directory, new.directory, rules)
    by_key = {cell_key(c): c for c in baseline.cells}
    new_keys = {cell_key(c) for c in new.cells}
    for cell in new.cells:
        old = by_key.get(cell_key(cell))
        if old is None:
            out.only_new.append(cell.label)
            continue
        out.matched.append(cell.label)
        _diff_cells(old, cell, rules, out)
    out.only_baseline = [c.label for c in baseline.cells if cell_key(c) not in new_keys]
    if not out.matched:
        raise ConfigError(
            f"no common cells: {baseline.directory} has {_names(baseline.cells)}; "
            f"{new.directory} has {_names(new.cells)} (cells match by op, stack, mode, "
            "target and GPU)")
    if not any(out.compared.values()) and not out.changes:
        raise ConfigError(f"no common cases: the cells in both sets ({', '.join(out.matched)})"
                          " have no verdict in common")
    return out


def _names(cells: list[CellReport], limit: int = 6) -> str:
    shown = [f"{c.label} ({cell_key(c)[4]})" for c in cells[:limit]]
    more = f" and {len(cells) - limit} more" if len(cells) > limit else ""
    return ", ".join(shown) + more
