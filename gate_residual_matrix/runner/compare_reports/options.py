"""The command-line options of a comparison, shared by ``compare`` and ``matrix --expect``.

Kept apart from the comparison itself so that the command line's parser imports nothing of
the tables' model (``python -m gate_residual_matrix cell`` starts many times per run).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gate_residual_matrix.runner.errors import ConfigError

__all__ = ["DEFAULT_OUT", "EXPECT_REPORTS", "add_rule_options", "refuse_without_expect"]

DEFAULT_OUT = Path("artifacts") / "compare"
"""Where ``compare.md`` and ``compare.json`` go unless ``--compare-out`` says otherwise: not
inside a reports directory, whose reader would take ``compare.json`` for a bad report."""
EXPECT_REPORTS = Path("artifacts") / "expect" / "reports"
"""Where ``matrix --expect DIR`` writes its reports when ``--reports`` is ``DIR`` itself (the
default ``reports`` with ``--expect reports/``): the baseline is never overwritten."""


def add_rule_options(p: argparse.ArgumentParser) -> None:
    """``--rules FILE``, ``--allow RULE``, ``--fail RULE``, ``--compare-out DIR``."""
    p.add_argument("--rules", type=Path, metavar="FILE", help="regression rules, YAML or "
                   "TOML (docs/ci.md); default: fail on every change for the worse")
    p.add_argument("--allow", action="append", default=[], metavar="RULE",
                   help='allow this change, e.g. "error:grew" (repeatable)')
    p.add_argument("--fail", action="append", default=[], metavar="RULE",
                   help='fail on this change, e.g. "bits:differ->equal" (repeatable)')
    p.add_argument("--compare-out", type=Path, default=DEFAULT_OUT, metavar="DIR",
                   help="write compare.md and compare.json here (default: %(default)s)")


def refuse_without_expect(args: argparse.Namespace) -> None:
    """``matrix`` given a comparison option but no ``--expect``: nothing would read it.

    Raises:
        ConfigError: naming the option (exit 2).
    """
    given = [f"--{name.replace('_', '-')}" for name in ("rules", "allow", "fail")
             if getattr(args, name)]
    if args.compare_out != DEFAULT_OUT:
        given.append("--compare-out")
    if given:
        raise ConfigError(f"{given[0]}: compares with a baseline; add --expect BASELINE_DIR")
