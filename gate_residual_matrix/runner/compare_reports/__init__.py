"""``compare``: which verdicts changed between two report sets, and whether that fails.

After an upgrade (vLLM, SGLang, Liger, torch), ``python -m gate_residual_matrix compare BASELINE_DIR
[NEW_DIR]`` (``nox -s compare``) matches the cells and pairs of the two sets and lists every
verdict that changed, with its cases: bits that were equal and differ, a side that was
repeatable and is not, batch invariance lost, a differing share or an error against fp64
that grew. Each change falls under a rule that fails (exit 6) or is allowed
(:mod:`.rules`); ``matrix --expect BASELINE_DIR`` runs, then compares (docs/ci.md).
Not to be confused with :mod:`contract.compare`, the bitwise comparison of two tensors.

Modules: :mod:`.options` (the command-line options), :mod:`.rules` (the rules and their
file), :mod:`.facts` (one report's verdicts, from the tables' model), :mod:`.diff`
(matching and changes), :mod:`.render` (terminal, Markdown, JSON), :mod:`.command` (the
command line's two entry points).

Example:
    >>> from gate_residual_matrix.runner.compare_reports import compare, load_set
    >>> result = compare(load_set(Path("old"), "BASELINE_DIR"), load_set(Path("reports"), "NEW"))
    >>> [c.rule for c in result.regressions]
    ['repeatable:yes->no']
"""

from __future__ import annotations

from typing import Any

__all__ = ["RULES", "Change", "Comparison", "ReportSet", "Rules", "compare", "load_rules",
           "load_set"]

_WHERE = {"RULES": "rules", "Rules": "rules", "load_rules": "rules", "Change": "diff",
          "Comparison": "diff", "ReportSet": "diff", "compare": "diff", "load_set": "diff"}


def __getattr__(name: str) -> Any:
    """The entry points, imported on first use: the command line's parser imports
    :mod:`.options` only, not the tables' model behind :mod:`.diff`."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
