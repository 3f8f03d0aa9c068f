"""The command line's two uses of a comparison: ``compare BASELINE_DIR [NEW_DIR]`` and
``matrix --expect BASELINE_DIR`` (run, then compare).

Both print the changes, write ``compare.md`` and ``compare.json`` to the output directory
(``--compare-out``, default :data:`runner.compare_reports.options.DEFAULT_OUT`: outside
every reports directory) and end with the comparison's code:
0 nothing regressed, :class:`~runner.errors.Regressed` (6) when something did; bad input is a
:class:`~runner.errors.ConfigError` (2), raised before anything runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from gate_residual_matrix.runner.compare_reports.diff import ReportSet, compare, load_set
from gate_residual_matrix.runner.compare_reports.options import EXPECT_REPORTS
from gate_residual_matrix.runner.compare_reports.render import (
    render_json,
    render_lines,
    render_markdown,
)
from gate_residual_matrix.runner.compare_reports.rules import Rules, load_rules
from gate_residual_matrix.runner.errors import CellsFailed, Regressed, ReportError
from gate_residual_matrix.runner.untrusted.files import write_text_atomic

__all__ = ["expect", "finish", "rules_of", "run_compare"]

def rules_of(args: argparse.Namespace) -> Rules:
    """The rules the options name (:func:`runner.compare_reports.rules.load_rules`)."""
    return load_rules(args.rules, args.allow, args.fail)


def finish(baseline: ReportSet, new: ReportSet, rules: Rules, out: Path,
           print_line: Callable[[str], None] = print) -> int:
    """Compare, print, write ``out/compare.md`` and ``out/compare.json``; return 0.

    Raises:
        ConfigError: no common cells or cases (exit 2).
        ReportError: the outputs cannot be written (exit 3).
        Regressed: a change its rules fail (exit 6), naming the first ones.
    """
    result = compare(baseline, new, rules)
    code = Regressed.exit_code if result.regressions else 0
    for line in render_lines(result):
        print_line(line)
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "compare.md", render_markdown(result))
        write_text_atomic(out / "compare.json", render_json(result, code))
    except OSError as err:
        raise ReportError(f"{out}: cannot write the comparison: {err.strerror or err}") from err
    print_line(f"[compare] written: {out / 'compare.md'}, {out / 'compare.json'}")
    if result.regressions:
        first = result.regressions[0]
        what = " ".join(x for x in (first.subject, first.tensor) if x)
        cases = sorted({c.case for c in result.regressions
                        if (c.cell, c.subject, c.tensor, c.rule) == (first.cell, first.subject,
                                                                     first.tensor, first.rule)
                        and c.case})
        raise Regressed(
            f"{len(result.regressions)} verdict(s) regressed against {baseline.directory}: "
            f"{first.cell}: {what}: {first.rule} ({first.before} → {first.after}"
            + (f"; cases {', '.join(cases)}" if cases else "") + f"); see {out / 'compare.md'}")
    return 0


def run_compare(args: argparse.Namespace) -> int:
    """``compare BASELINE_DIR [NEW_DIR]``: read both sets (exit 2 on bad input), then
    :func:`finish`."""
    rules = rules_of(args)
    baseline = load_set(args.baseline, "BASELINE_DIR", exclude=args.new)
    new = load_set(args.new, "NEW_DIR", exclude=args.baseline)
    return finish(baseline, new, rules, args.compare_out)


def _same_dir(a: Path, b: Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def expect(args: argparse.Namespace, run: Callable[[argparse.Namespace], int]) -> int:
    """``matrix --expect BASELINE_DIR``: read the baseline and the rules first (bad input:
    exit 2, nothing run), run the matrix with ``run`` (into
    :data:`~runner.compare_reports.options.EXPECT_REPORTS` when ``--reports`` is the baseline
    directory), then compare.

    The code is the comparison's (0, or 6 when a verdict regressed); when nothing regressed
    but a cell of the run failed, the run's 5 (a failed cell is never a pass).
    """
    rules = rules_of(args)
    baseline = load_set(args.expect, "--expect", exclude=args.reports)
    if _same_dir(args.reports, args.expect):
        args.reports = EXPECT_REPORTS
        if args.reports.is_dir() and not args.reports.is_symlink():
            shutil.rmtree(args.reports)  # our scratch directory: each run starts it afresh
        print(f"[runner] --expect {args.expect}: the new reports go to {args.reports} (emptied "
              "first), so the baseline stays as it is")
    failed: CellsFailed | None = None
    try:
        run(args)
    except CellsFailed as err:
        failed = err
        print(f"[runner] {err}")
    new = load_set(args.reports, "--reports", exclude=args.expect)
    code = finish(baseline, new, rules, args.compare_out)
    if failed is not None:
        raise failed
    return code
