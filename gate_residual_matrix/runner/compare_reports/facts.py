"""The verdicts of one cell report as comparable facts, one per (kind, subject, case, tensor).

The pairs and their CMPs come from the tables' model
(:func:`runner.tables.model.bits.pair_results`: each unordered pair once, oriented "candidate
vs baseline", cases in the report's order), so ``compare`` sees exactly the pairs the tables
show. Kinds:

* ``bits``: a pair's tensor in a case: :class:`Bits` (``equal``, ``nan_payload``: the elements
  that differ are NaN on both sides, or ``differ``; with the count and element count);
* ``repeatable``, ``across_processes``: an implementation's tensor in a case: bool
  (``results[impl].repeatable``, ``repeatable_across_processes``);
* ``batch_invariant``: an implementation in a case (per tensor where the report says so):
  bool, all named checks true (``results[impl].batch_invariant``);
* ``error``: an implementation's tensor in a case against fp64: ``max_abs_ulps``, else
  ``max_abs`` (``results[impl].accuracy``; ``"inf"`` is infinity);
* ``impl_status``: an implementation's status in the cell (case and tensor ``""``);
* ``inputs``: a case's input sha256, canonical JSON (subject and tensor ``""``).

Implementation names can be renamed on the way (:func:`facts`' ``rename``): a library row of
one version matched with another version's row is compared under one name.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gate_residual_matrix.runner.reports import tensors as report_tensors
from gate_residual_matrix.runner.tables import CellReport, pair_results

__all__ = ["Bits", "FactKey", "facts"]

FactKey = tuple[str, str, str, str]
"""(kind, subject, case, tensor): ``("bits", "numba vs eager", "257", "gate")``."""


@dataclass(frozen=True)
class Bits:
    """One CMP as a verdict: ``state`` (``equal``, ``nan_payload``, ``differ``), the count of
    differing elements and the element count (``numel`` 0 when the report has none)."""

    state: str
    differ: int
    numel: int

    @property
    def fraction(self) -> float:
        """The share of elements that differ, in [0, 1] (1 when the count is unknown)."""
        return self.differ / self.numel if self.numel else (0.0 if self.state == "equal"
                                                            else 1.0)

    def describe(self) -> str:
        """``equal``, ``NaN payloads 12/48384``, ``35150/48384 differ``."""
        if self.state == "equal":
            return "equal"
        count = f"{self.differ}/{self.numel}" if self.numel else "some elements"
        return f"NaN payloads {count}" if self.state == "nan_payload" else f"{count} differ"


def _bits(cmp: Mapping[str, Any]) -> Bits:
    differ = cmp.get("differ")
    differ = differ if isinstance(differ, int) and not isinstance(differ, bool) else 0
    numel = cmp.get("numel")
    numel = numel if isinstance(numel, int) and not isinstance(numel, bool) else 0
    if cmp.get("equal"):
        return Bits("equal", 0, numel)
    payload = cmp.get("nan_payload_differ")
    state = "nan_payload" if payload and payload == cmp.get("differ") else "differ"
    return Bits(state, differ, numel)


def _checks(value: Any) -> bool | None:
    """A batch-invariance verdict as one bool: a bool, or an object of named checks (every
    bool among its values must hold); None when it holds no verdict."""
    if isinstance(value, bool):
        return value
    if isinstance(value, Mapping):
        checks = [v for v in value.values() if isinstance(v, bool)]
        return all(checks) if checks else None
    return None


def _number(value: Any) -> float | None:
    if value == "inf":
        return math.inf
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _error(figure: Any) -> float | None:
    """An accuracy figure's error: ``max_abs_ulps``, else ``max_abs``."""
    if not isinstance(figure, Mapping):
        return None
    ulps = _number(figure.get("max_abs_ulps"))
    return ulps if ulps is not None else _number(figure.get("max_abs"))


def _impl_facts(cell: CellReport, impl: str, entry: Mapping[str, Any], name: str,
                tensors: list[str], out: dict[FactKey, Any]) -> None:
    """``out`` gains one implementation's status, repeatability, batch invariance, errors."""
    out[("impl_status", name, "", "")] = str(entry.get("status") or "ok")
    for kind, key in (("repeatable", "repeatable"),
                      ("across_processes", "repeatable_across_processes")):
        for case, per_tensor in (entry.get(key) or {}).items():
            for tensor, value in (per_tensor or {}).items():
                if isinstance(value, bool):
                    out[(kind, name, str(case), tensor)] = value
    invariant = entry.get("batch_invariant")
    for case in cell.cases:
        value = invariant
        if isinstance(value, Mapping) and case in value:
            value = value[case]
        elif isinstance(value, Mapping) and any(c in value for c in cell.cases):
            continue  # per case, and not this one
        if isinstance(value, Mapping) and any(t in value for t in tensors):
            for tensor in tensors:
                verdict = _checks(value.get(tensor))
                if verdict is not None:
                    out[("batch_invariant", name, case, tensor)] = verdict
        elif (verdict := _checks(value)) is not None:
            out[("batch_invariant", name, case, "")] = verdict
    if entry.get("role") == "accuracy_reference" or impl == cell.data.get(
            "accuracy_reference"):
        return
    for case, figures in (entry.get("accuracy") or {}).items():
        figures = figures or {}
        found = {"out": figures.get("out"), **(figures.get("grads") or {})}
        for tensor, figure in found.items():
            error = _error(figure)
            if error is not None:
                out[("error", name, str(case), tensor)] = error


def facts(cell: CellReport, rename: Callable[[str], str] = str) -> dict[FactKey, Any]:
    """Every verdict of ``cell`` as ``{(kind, subject, case, tensor): value}`` (module
    docstring); implementation names pass through ``rename``.

    Example:
        >>> facts(cell)[("bits", "numba vs eager", "257", "gate")]
        Bits(state='differ', differ=35150, numel=48384)
    """
    out: dict[FactKey, Any] = {}
    for r in pair_results(cell):
        subject = f"{rename(r.a)} vs {rename(r.b)}"
        for tensor, cmp in r.tensors.items():
            if cmp:
                out[("bits", subject, r.case, tensor)] = _bits(cmp)
    tensors = list(report_tensors.labels(cell.data))
    for impl, entry in cell.results.items():
        if isinstance(entry, Mapping):
            _impl_facts(cell, impl, entry, rename(impl), tensors, out)
    for case, given in (cell.data.get("inputs") or {}).items():
        sha = (given or {}).get("sha256")
        if sha:
            out[("inputs", "", str(case), "")] = json.dumps(sha, sort_keys=True)
    return out
