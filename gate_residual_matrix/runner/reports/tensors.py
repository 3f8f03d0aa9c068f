"""The tensors a report compares, as its op names them (schema version 2's ``tensors``).

A report of ours carries its op's outputs (key -> label and shape, :meth:`ops.spec.OpSpec.
table`); a version-1 report gets them when it is read (it is of the first op, the only one
then: :data:`ops.OPS`), and so does a foreign report in the reference layout. The tables
take their tensor columns and words from here, so they name each op's tensors and no op's
in particular.

Example::

    >>> labels({"tensors": {"out": {"label": "out", "shape": ["N", "D"]},
    ...                     "x": {"label": "grad_x", "shape": ["N", "D"]}}})
    {'out': 'out', 'x': 'grad_x'}
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from gate_residual_matrix import ops


def _first_op_table() -> dict[str, dict[str, Any]]:
    return ops.get(ops.OPS[0]).table()


def table(data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """key -> ``{"label", "shape"}`` of the report's outputs, in order: its ``tensors``, else
    its op's (a known op), else the first op's (a version-1 or foreign report)."""
    found = data.get("tensors")
    if isinstance(found, Mapping) and found:
        return {str(k): dict(v) if isinstance(v, Mapping) else {"label": str(k), "shape": []}
                for k, v in found.items()}
    op = data.get("op")
    return ops.get(op).table() if op in ops.OPS else _first_op_table()


def index_groups(data: Mapping[str, Any]) -> str | None:
    """The problem size the report's index ranges over (its ``index_groups``, else its
    op's, else the first op's); None for a known op without an index."""
    found = data.get("index_groups")
    if isinstance(found, str) and found:
        return found
    op = data.get("op")
    return ops.get(op if op in ops.OPS else ops.OPS[0]).groups


def flat(entry: Mapping[str, Any] | None) -> dict[str, Any]:
    """One case's entry in the report's per-tensor layout (``{"out": [cmp], "grads": {...}}``
    in comparisons, ``{"out": figures, "grads": {...}}`` in accuracy) as tensor key -> value:
    every forward output (a list's first element) and every gradient.

    Example:
        >>> flat({"out": [1], "h": [2], "grads": {"x": 3}})
        {'out': 1, 'h': 2, 'x': 3}
    """
    if not isinstance(entry, Mapping):
        return {}
    found = {str(k): (v or [None])[0] if isinstance(v, list) else v
             for k, v in entry.items() if k != "grads"}
    grads = entry.get("grads")
    if isinstance(grads, Mapping):
        found.update(grads)
    return found


def labels(data: Mapping[str, Any]) -> dict[str, str]:
    """key -> label (``"gate"`` -> ``"grad_gate"``) of the report's outputs, in order."""
    return {k: str(v.get("label") or k) for k, v in table(data).items()}


def columns(datas: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """The tensor keys of several reports, each once, in the order first seen (one op's
    reports: its outputs in order; with no report, the first op's)."""
    keys: dict[str, None] = {}
    for data in datas:
        keys.update(dict.fromkeys(labels(data)))
    return tuple(keys) or tuple(_first_op_table())


def legend(datas: Iterable[Mapping[str, Any]]) -> str:
    """``"`res` = grad_res, `y` = grad_y, ..."``: each key whose label differs from it, per
    op when the reports hold several (``"gate_residual: ...; indexed_scale_shift: ..."``)."""
    per_op: dict[str, dict[str, str]] = {}
    for data in datas:
        op = str(data.get("op") or ops.OPS[0])
        per_op.setdefault(op, {}).update(labels(data))
    if not per_op:
        per_op[ops.OPS[0]] = labels({})
    parts = {op: ", ".join(f"`{k}` = {v}" for k, v in names.items() if k != v)
             for op, names in per_op.items()}
    if len(parts) == 1:
        return next(iter(parts.values()))
    return "; ".join(f"{op}: {text}" for op, text in parts.items())


def title(datas: Iterable[Mapping[str, Any]]) -> str:
    """``"<op>, <op> reproducibility matrix"``: the reports' ops in the order of
    :data:`ops.OPS` (unknown ones after; no report: the first op)."""
    found = {str(d.get("op") or ops.OPS[0]) for d in datas}
    named = [op for op in ops.OPS if op in found] + sorted(found - set(ops.OPS))
    return f"{', '.join(named or ops.OPS[:1])} reproducibility matrix"


def upgrade_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A version-1 report as version 2: ``tensors`` and ``index_groups`` of the first op (the
    only op version 1 had: its ``op`` was that op's name, or text no runner wrote)."""
    spec = ops.get(ops.OPS[0])
    return {**data, "schema_version": 2, "tensors": spec.table(), "index_groups": spec.groups}


class PairRow(NamedTuple):
    """One ``results[impl]["vs <other>"][case]`` entry, flattened.

    ``tensors`` maps each present tensor of the report (:func:`runner.reports.tensors.labels`,
    in that order) to its CMP dict (the forward output's is the first element of its list);
    a tensor absent from the file is absent here.
    """

    impl: str
    other: str
    case_id: str
    tensors: dict[str, dict[str, Any]]


def _ordered_cases(data: Mapping[str, Any], keys: list[str]) -> list[str]:
    """``keys`` in the order of ``data["cases"]``, then the unlisted ones (sets: linear)."""
    listed = [str(c) for c in data.get("cases", [])]
    present, known = set(keys), set(listed)
    return [c for c in listed if c in present] + [k for k in keys if k not in known]


def iter_pairs(data: Mapping[str, Any]) -> Iterator[PairRow]:
    """Yield every comparison in a report, ours or foreign, in a stable order.

    Order: implementations and their ``"vs <x>"`` keys as in the file, cases in the
    order of ``data["cases"]`` (then any unlisted case keys). Both directions of a pair
    are yielded if both are in the file; the tables drop the mirror.

    Example:
        >>> next(iter_pairs(reference)).tensors["gate"]["differ"]
        0
    """
    order = labels(data)
    for impl, entry in data.get("results", {}).items():
        for key, by_case in entry.items():
            if not key.startswith("vs "):
                continue
            for case in _ordered_cases(data, list(by_case)):
                comparison = by_case[case]
                tensors = {k: (v or [None])[0] for k, v in comparison.items()
                           if isinstance(v, list)}
                tensors.update(comparison.get("grads") or {})
                ordered = {n: tensors[n] for n in order if tensors.get(n) is not None}
                yield PairRow(impl, key[3:], case, ordered)
