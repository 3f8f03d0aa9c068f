"""A :class:`~runner.compare_reports.diff.Comparison` as lines for the terminal, Markdown
(``compare.md``) and JSON (``compare.json``, ``"schema": "gate_residual_compare/1"``).

Changes are grouped by cell, subject, tensor, rule and verdict; each group lists its cases,
with the values before and after (once when every case has the same, else per case).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from tabulate import tabulate

from gate_residual_matrix.runner.compare_reports.diff import Change, Comparison
from gate_residual_matrix.runner.tables import md_text

__all__ = ["SCHEMA", "grouped", "render_json", "render_lines", "render_markdown", "summary"]

SCHEMA = "gate_residual_compare/1"
_ORDER = {"REGRESSED": 0, "unstable": 1, "allowed": 2}
_MAX_CASES = 12


def grouped(changes: Sequence[Change]) -> list[tuple[Change, str, str]]:
    """One entry per (cell, subject, tensor, rule, verdict): its first change, its cases
    (cut after 12 with a count) and ``before → after``, regressions first. When the cases'
    values differ, the cases are ``""`` and the change lists ``case: before → after`` each."""
    groups: dict[tuple[str, ...], list[Change]] = {}
    for c in changes:
        groups.setdefault((c.cell, c.subject, c.tensor, c.rule, c.verdict), []).append(c)
    out = []
    for members in groups.values():
        first = members[0]
        more = len(members) - _MAX_CASES
        if len({(m.before, m.after) for m in members}) == 1:
            cases = ", ".join(m.case for m in members[:_MAX_CASES] if m.case)
            cases += f" and {more} more" if more > 0 else ""
            out.append((first, cases, f"{first.before} → {first.after}"))
        else:
            change = "; ".join(f"{m.case}: {m.before} → {m.after}" for m in members[:_MAX_CASES])
            out.append((first, "", change + (f"; and {more} more" if more > 0 else "")))
    return sorted(out, key=lambda g: _ORDER[g[0].verdict])


def summary(result: Comparison) -> str:
    """``2 regressed, 1 allowed, 0 unstable changes in 1 of 1 common cells (340 verdicts
    compared)``."""
    counts = {v: sum(c.verdict == v for c in result.changes) for v in _ORDER}
    return (f"{counts['REGRESSED']} regressed, {counts['allowed']} allowed, "
            f"{counts['unstable']} unstable verdict changes in {len(result.matched)} common "
            f"cell(s) ({sum(result.compared.values())} verdicts compared)")


def _what(c: Change) -> str:
    return " ".join(x for x in (c.subject, c.tensor) if x)


def render_lines(result: Comparison) -> list[str]:
    """The comparison as lines for the terminal: the sets, each cell's set-up changes, one
    line per group of changes, then :func:`summary`."""
    lines = [f"[compare] baseline {result.baseline} vs new {result.new}: "
             f"{len(result.matched)} cell(s) in both"]
    if result.only_baseline:
        lines.append(f"[compare] only in the baseline: {', '.join(result.only_baseline)}")
    if result.only_new:
        lines.append(f"[compare] only in the new set: {', '.join(result.only_new)}")
    for cell in result.matched:
        details = [*result.setup.get(cell, []),
                   *(f"matched across versions: {r}" for r in result.renamed.get(cell, [])),
                   *result.uncompared.get(cell, [])]
        if details:
            lines.append(f"[compare] {cell}: " + "; ".join(details))
    for first, cases, change in grouped(result.changes):
        lines.append(f"{first.verdict:<9} {first.cell}: {_what(first)}: {first.rule}: "
                     f"{change}" + (f" (cases {cases})" if cases else ""))
    lines.append(f"[compare] {summary(result)}")
    return lines


def render_markdown(result: Comparison) -> str:
    """The comparison as a Markdown page: what was compared, the rules that fail, the
    changes (regressions first), the cells' set-up changes."""
    parts = ["# Verdicts that changed\n",
             f"Baseline `{md_text(result.baseline)}`, new `{md_text(result.new)}`: "
             f"{md_text(summary(result))}.\n",
             "Rules that fail: " + ", ".join(f"`{r}`" for r in result.rules.describe()["fail"])
             + ". `unstable`: a side was not repeatable in one of the reports, so its bits move "
               "from run to run; not gated (docs/ci.md).\n"]
    rows = [[*(md_text(x) for x in (f.verdict, f.cell, f.subject, f.tensor or "—")),
             f"`{f.rule}`", md_text(change), md_text(cases or "—")]  # rule names: [a-z_:>-]
            for f, cases, change in grouped(result.changes)]
    if rows:
        parts.append(tabulate(rows, headers=["verdict", "cell", "pair or implementation",
                                             "tensor", "rule", "before → after",
                                             "cases (else as listed)"],
                              tablefmt="github", disable_numparse=True) + "\n")
    else:
        parts.append("_No verdict changed._\n")
    parts.append("## Cells\n")
    cells = [[md_text(cell), "both", md_text(str(result.compared.get(cell, 0))),
              md_text("; ".join([*result.setup.get(cell, []),
                                 *(f"across versions: {r}" for r in result.renamed.get(cell, [])),
                                 *result.uncompared.get(cell, [])]) or "—")]
             for cell in result.matched]
    cells += [[md_text(c), "baseline only", "0", "—"] for c in result.only_baseline]
    cells += [[md_text(c), "new only", "0", "—"] for c in result.only_new]
    parts.append(tabulate(cells, headers=["cell", "in", "verdicts compared",
                                          "set-up changes and notes"],
                          tablefmt="github", disable_numparse=True) + "\n")
    return "\n".join(parts)


def render_json(result: Comparison, exit_code: int) -> str:
    """The comparison as JSON: the sets, rules, cells and every change with its verdict."""
    doc: dict[str, Any] = {
        "schema": SCHEMA, "baseline": str(result.baseline), "new": str(result.new),
        "exit_code": exit_code, "regressed": bool(result.regressions),
        "summary": summary(result), "rules": result.rules.describe(),
        "cells": {"matched": result.matched, "only_baseline": result.only_baseline,
                  "only_new": result.only_new},
        "setup": result.setup, "matched_across_versions": result.renamed,
        "compared": result.compared, "notes": result.uncompared,
        "changes": [{**asdict(c), "verdict": c.verdict} for c in result.changes],
    }
    return json.dumps(doc, indent=1, ensure_ascii=False, allow_nan=False) + "\n"
