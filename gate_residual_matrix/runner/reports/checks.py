"""The rules a report must keep beyond its JSON Schema, one line per broken rule.

:mod:`runner.reports.store` runs these after the schema (``runner/schema/report.schema.json``) has
accepted a report, so every value here has the type the schema gives it:

* :func:`json_problems`: what ``json.dump(allow_nan=False)`` would reject or change;
* :func:`ours_problems`: our reports (``schema_version``): the cell id is
  ``<op's cell prefix><stack>-<mode>-<target>``; ``inputs`` per case agree with the case id
  (N, specials, dtypes) and with the index's value count; every CMP is of one of the
  report's ``tensors`` and its ``numel`` is that tensor's size in the case (its shape, N read
  from the case id: ``"257-specials"``: 257); and :func:`comparison_problems`;
* :func:`comparison_problems` (ours and foreign): every ``"vs <x>"`` map names another
  implementation of the report, its case keys are listed in ``cases``, each CMP is consistent
  (``equal`` against ``differ``, every count against ``numel``, ``max_abs`` of equal bits),
  and the two directions of a pair agree.

Each function yields ``<path in the document>: <what is wrong>``; the path is built only for
a problem (a report of 20,000 cases holds 180,000 CMPs). Of the runner only
:mod:`runner.reports.tensors` is imported (it imports :mod:`ops` alone): :mod:`runner.reports.store`
imports this one.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from gate_residual_matrix.runner.reports import tensors as report_tensors

__all__ = ["CELL_ID_RE", "MAX_CASES", "MAX_IMPLEMENTATIONS", "MAX_LIBRARIES",
           "batch_invariance_problems", "bound_problem", "comparison_problems", "data_problems",
           "foreign_problems", "json_problems", "ours_problems", "pair_problems", "path_str"]

CELL_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CASE_RE = re.compile(r"^([0-9]+)(-specials)?(-grouped)?(?:-([a-z0-9]+)-(int[0-9]+))?$")
MAX_CASES = 20_000
"""Case ids a report may list (``cases``, ``cases_missing``): the tables hold rows per case,
tensor and pair, so a report of 200,000 cases made a summary.json of a gigabyte. Our matrix
has tens; a benchmark of the tables' scale uses 20,000."""
MAX_IMPLEMENTATIONS = 1_000
"""Implementations a report may hold (``results``): rows and comparisons grow with them."""
MAX_LIBRARIES = 1_000
"""Entries of ``environment.libraries``: each is a column of every cell's configuration."""
_SYMMETRIC = ("equal", "differ", "numel", "max_abs", "max_ulp", "nan_differ",
              "nan_payload_differ", "first_differ")
"""CMP figures that do not depend on the direction of the comparison."""


def path_str(parts: Iterator[Any] | list[Any] | tuple[Any, ...]) -> str:
    """``results.numba["vs eager"]["257"].out[0].max_abs``; ``(root)`` for the document."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _IDENT_RE.match(str(part)):
            text += f".{part}" if text else str(part)
        else:
            text += f"[{json.dumps(str(part))}]"
    return text or "(root)"


def json_problems(value: Any, path: tuple[Any, ...] = ()) -> Iterator[str]:
    """What ``json.dump(allow_nan=False)`` would reject or silently change, with its path."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                yield f"{path_str(path)}: object key {key!r} is not a string"
            else:
                yield from json_problems(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from json_problems(item, (*path, i))
    elif isinstance(value, float):
        if not math.isfinite(value):
            yield (
                f"{path_str(path)}: non-finite number {value!r} "
                f'(JSON has none; encode infinity as "inf")'
            )
    elif value is not None and not isinstance(value, (str, int, bool)):
        yield f"{path_str(path)}: {type(value).__name__} is not a JSON type"


def bound_problem(report: Mapping[str, Any]) -> str | None:
    """Why the report is too big to show (more than :data:`MAX_CASES` case ids,
    :data:`MAX_IMPLEMENTATIONS` implementations or :data:`MAX_LIBRARIES` libraries), or None.
    Checked before the schema, in constant time: what is shown grows with these counts, so
    a report past them is flagged, not expanded."""
    sized = [(key, report.get(key), MAX_CASES, "case ids") for key in ("cases", "cases_missing")]
    sized.append(("results", report.get("results"), MAX_IMPLEMENTATIONS, "implementations"))
    env = report.get("environment")
    sized.append(("environment.libraries", env.get("libraries") if isinstance(env, Mapping)
                  else None, MAX_LIBRARIES, "entries"))
    for key, value, limit, what in sized:
        if isinstance(value, (list, Mapping)) and len(value) > limit:
            return (f"{key}: {len(value)} {what}, more than the {limit} a report may have "
                    "(the tables grow with them): not shown")
    return None


def _cmp_problems(cmp: Mapping[str, Any], path: tuple[Any, ...]) -> Iterator[str]:
    """A CMP's counts against each other: ``equal`` against ``differ``, every count against
    ``numel``, ``max_abs`` of equal bits."""
    equal, differ, numel = cmp["equal"], cmp["differ"], cmp["numel"]
    first = cmp.get("first_differ")
    if (equal == (differ == 0) and differ <= numel and cmp.get("nan_differ", 0) <= differ
            and cmp.get("nan_payload_differ", 0) <= differ
            and (first is None or (not equal and first < numel))
            and not (equal and cmp["max_abs"] != 0)):
        return  # the common case, without building the path
    where = path_str(path)
    if equal != (differ == 0):
        yield f"{where}: equal is {equal} but differ is {differ}"
    if differ > numel:
        yield f"{where}: differ {differ} exceeds numel {numel}"
    for key in ("nan_differ", "nan_payload_differ"):
        if cmp.get(key, 0) > differ:
            yield f"{where}: {key} {cmp[key]} exceeds differ {differ}"
    if first is not None and (equal or first >= numel):
        yield f"{where}: first_differ {first} with equal {equal} and numel {numel}"
    if equal and cmp["max_abs"] != 0:
        yield f"{where}: equal bits but max_abs is {cmp['max_abs']}"


def _comparison_tensors(comparison: Mapping[str, Any]) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """``(path below the case, CMP)`` for every CMP of one ``results[a]["vs b"][case]``."""
    for key, value in comparison.items():
        if isinstance(value, list):
            for i, cmp in enumerate(value):
                yield (key, i), cmp
    for name, cmp in comparison.get("grads", {}).items():
        yield ("grads", name), cmp


def comparison_problems(report: Mapping[str, Any], cases: set[str]) -> Iterator[str]:
    """Every ``"vs <x>"`` map (ours and foreign): case keys listed, each CMP consistent, and
    both directions of a pair (``results[a]["vs b"]``, ``results[b]["vs a"]``) agreeing."""
    results = report["results"]
    for impl, entry in results.items():
        for vs_key, by_case in entry.items():
            if not vs_key.startswith("vs "):
                continue
            if vs_key[3:] == impl or vs_key[3:] not in results:
                yield (f"{path_str(('results', impl, vs_key))}: compares with "
                       f"{'itself' if vs_key[3:] == impl else 'no implementation of the report'}")
                continue
            mirror = (results.get(vs_key[3:]) or {}).get(f"vs {impl}") or {}
            first_name = impl < vs_key[3:]  # each pair is compared once, from its first name
            for case, comparison in by_case.items():
                here = ("results", impl, vs_key, case)
                if case not in cases:
                    yield f'{path_str(here)}: case "{case}" is not listed in cases'
                back_case = mirror.get(case) if first_name else None
                other = dict(_comparison_tensors(back_case)) if back_case else {}
                for sub, cmp in _comparison_tensors(comparison):
                    yield from _cmp_problems(cmp, (*here, *sub))
                    back = other.get(sub)
                    if back is None:
                        continue
                    for key in _SYMMETRIC:
                        if key in cmp and key in back and cmp[key] != back[key]:
                            there = ("results", vs_key[3:], f"vs {impl}", case, *sub)
                            yield (f"{path_str((*here, *sub))}: {key} is {cmp[key]} but "
                                   f"{path_str(there)} says {back[key]}")
                            break


def _case_rows(case: str) -> tuple[int, bool] | None:
    """N and whether specials are planted, as a case id says (``"257-specials"``: 257)."""
    m = _CASE_RE.match(case)
    return None if m is None else (int(m.group(1)), bool(m.group(2)))


def _numel_problems(report: Mapping[str, Any]) -> Iterator[str]:
    """Each CMP is of a tensor the report lists (``tensors``), and its ``numel`` is that
    tensor's size in the case: the product of its shape, N from the case id and the other
    symbols from ``problem``. A report without ``problem`` (one that failed before it was
    known) has no sizes to check."""
    problem = report.get("problem")
    if not problem:
        return
    shapes = {k: v["shape"] for k, v in report_tensors.table(report).items()}
    for impl, entry in report["results"].items():
        for vs_key, by_case in entry.items():
            if not vs_key.startswith("vs "):
                continue
            for case, comparison in by_case.items():
                rows = _case_rows(case)
                if rows is None:
                    continue  # the schema's case_key pattern makes this unreachable
                for sub, cmp in _comparison_tensors(comparison):
                    where = path_str(("results", impl, vs_key, case, *sub))
                    tensor = sub[0] if sub[0] != "grads" else sub[1]
                    if tensor not in shapes:
                        yield (f"{where}: tensor {json.dumps(tensor)} is not one of the "
                               f"report's tensors ({', '.join(shapes)})")
                        continue
                    sizes = {**problem, "N": rows[0]}
                    if not all(isinstance(sizes.get(s), int) for s in shapes[tensor]):
                        yield f"{where}: shape {' x '.join(shapes[tensor])} has no size in problem"
                        continue
                    want = math.prod(sizes[s] for s in shapes[tensor])
                    if cmp["numel"] != want:
                        shape = " x ".join(shapes[tensor])
                        given = ", ".join(f"{s} = {sizes[s]}" for s in dict.fromkeys(
                            shapes[tensor]))
                        yield (f"{where}: numel is {cmp['numel']}, not {shape} = {want} "
                               f"({given})")


def _inputs_problems(report: Mapping[str, Any], cases: set[str]) -> Iterator[str]:
    """``inputs[case]``: listed in ``cases``; ``n`` and ``specials`` as the case id says;
    ``index_counts`` one count per index value (the ``index_groups`` size of ``problem``)
    summing to n; dtypes as a case id naming them says."""
    groups = report_tensors.index_groups(report)
    g = (report.get("problem") or {}).get(groups)
    for key, given in report.get("inputs", {}).items():
        where = path_str(("inputs", key))
        if key not in cases:
            yield f'{where}: case "{key}" is not listed in cases'
        named = _CASE_RE.match(key)
        if named is None:
            continue  # the schema's case_key pattern makes this unreachable
        n, specials = int(named.group(1)), bool(named.group(2))
        if given["n"] != n:
            yield f"{where}.n: the case id says N = {n}, the inputs say n = {given['n']}"
        if given["specials"] != specials:
            yield (f"{where}.specials: the case id says {specials}, "
                   f"the inputs say {given['specials']}")
        if given.get("grouped", False) != bool(named.group(3)):
            yield (f"{where}.grouped: the case id says {bool(named.group(3))}, "
                   f"the inputs say {given.get('grouped', False)}")
        counts = given.get("index_counts")
        if counts is not None and g is not None and len(counts) != g:
            yield f"{where}.index_counts: {len(counts)} counts for {groups} = {g} index values"
        if counts is not None and sum(counts) != given["n"]:
            yield f"{where}.index_counts: they sum to {sum(counts)}, not n = {given['n']}"
        dtypes = named.group(4, 5)
        if dtypes[0] and any(given.get(k, v) != v for k, v in zip(
                ("dtype", "index_dtype"), dtypes, strict=True)):
            yield (f"{where}: case {key} names {'/'.join(dtypes)} but its inputs are "
                   f"{given.get('dtype')}/{given.get('index_dtype')}")


def _repeated_case_problems(report: Mapping[str, Any]) -> Iterator[str]:
    """Case ids listed twice in ``cases`` or ``cases_missing`` (as the report's maps key
    them: ``1`` and ``"1"`` are one case), found in linear time."""
    for key in ("cases", "cases_missing"):
        seen: set[str] = set()
        repeated: list[str] = []
        for case in report.get(key) or []:
            if str(case) in seen:
                repeated.append(str(case))
            seen.add(str(case))
        if repeated:
            more = f" (and {len(repeated) - 3} more)" if len(repeated) > 3 else ""
            yield (f"{key}: each case id once, got {json.dumps(repeated[0])} again"
                   + (f" and {', '.join(json.dumps(r) for r in repeated[1:3])}"
                      if len(repeated) > 1 else "") + more)


def _few(ids: list[str]) -> str:
    """``"3"`` or ``"3", "4" (and 5 more)``: the first ids of a list, quoted."""
    more = f" (and {len(ids) - 2} more)" if len(ids) > 2 else ""
    return ", ".join(json.dumps(i) for i in ids[:2]) + more


def pair_problems(report: Mapping[str, Any], *, foreign: bool) -> Iterator[str]:
    """Each comparison is there in both directions over the same cases
    (``results[a]["vs b"]`` and ``results[b]["vs a"]``); in a foreign report (which shows
    comparisons only) every implementation is compared with another and every comparison
    covers every listed case."""
    results = report["results"]
    listed = [str(c) for c in report["cases"]]
    for impl, entry in results.items():
        keys = [k for k in entry if k.startswith("vs ")]
        if foreign and not keys:
            yield (f"{path_str(('results', impl))}: compared with no other implementation "
                   "(a foreign report shows comparisons only)")
        for key in keys:
            other = key[3:]
            if other == impl or other not in results:
                continue  # comparison_problems names it
            here, back = entry[key], results[other].get(f"vs {impl}")
            where = path_str(("results", impl, key))
            if foreign:
                missing = [c for c in listed if c not in here]
                if missing:
                    yield f"{where}: no comparison for listed case(s) {_few(missing)}"
            if impl > other:
                continue  # the pair's other direction says the rest
            if back is None:
                yield f'{where}: results.{other} has no "vs {impl}" (one direction only)'
            elif here.keys() != back.keys():
                odd = sorted(here.keys() ^ back.keys())
                yield f"{where}: case(s) {_few(odd)} compared in one direction only"


def data_problems(report: Mapping[str, Any]) -> Iterator[str]:
    """An ``ok`` or ``mismatch`` report has, for every case it lists, its inputs and a result
    of some implementation (a hash or a comparison): a listed case without them was not
    measured, and the tables would show it as if it were."""
    if report.get("status") not in ("ok", "mismatch"):
        return
    inputs = report.get("inputs") or {}
    measured: set[str] = set()
    for entry in report["results"].values():
        for key, value in entry.items():
            if (key == "sha256" or key.startswith("vs ")) and isinstance(value, Mapping):
                measured.update(value)
    bare = [str(c) for c in report["cases"] if str(c) not in inputs or str(c) not in measured]
    if bare:
        yield (f"cases: {len(bare)} of {len(report['cases'])} listed case(s) have no inputs "
               f"or no result ({_few(bare)}), in a report whose status is {report['status']}")


_CHECKS = ("row_alone", "sub_batches", "size_sweep")


def batch_invariance_problems(report: Mapping[str, Any]) -> Iterator[str]:
    """Every ``batch_invariant`` record (per case and/or per tensor) that holds the checks of
    :func:`runner.cell.batch_invariance.check` agrees with itself: the checks are true or false
    (not numbers), ``first_failing_size`` is a size from 1 to ``max_size`` exactly when
    ``size_sweep`` is false."""
    def walk(value: Any, path: tuple[Any, ...]) -> Iterator[str]:
        if not isinstance(value, Mapping):
            return
        if not any(k in value for k in (*_CHECKS, "first_failing_size")):
            for key, item in value.items():
                yield from walk(item, (*path, key))
            return
        where = path_str(path)
        for key in _CHECKS:
            if key in value and not isinstance(value[key], bool):
                yield f"{where}.{key}: expected true or false, got {json.dumps(value[key])}"
        first, sweep, top = (value.get("first_failing_size"), value.get("size_sweep"),
                             value.get("max_size"))
        if first is not None and (isinstance(first, bool) or not isinstance(first, int)
                                  or first < 1 or (isinstance(top, int) and first > top)):
            yield f"{where}.first_failing_size: expected a size 1..max_size, got {first}"
        if isinstance(sweep, bool) and "first_failing_size" in value and (
                sweep == (first is not None)):
            yield (f"{where}: size_sweep is {json.dumps(sweep)} but first_failing_size is "
                   f"{json.dumps(first)}")

    for impl, entry in report["results"].items():
        if "batch_invariant" in entry:
            yield from walk(entry["batch_invariant"], ("results", impl, "batch_invariant"))


def _cell_prefix(report: Mapping[str, Any]) -> str:
    """The cell id prefix of the report's op (:attr:`ops.spec.OpSpec.cell_prefix`); "" for
    an op this runner does not know."""
    from gate_residual_matrix import ops
    op = report.get("op")
    return ops.get(op).cell_prefix if op in ops.OPS else ""


def ours_problems(report: Mapping[str, Any]) -> Iterator[str]:
    """Every rule beyond the schema that our report (``schema_version``) must keep; only
    called on a schema-valid report."""
    cell = report["cell"]
    cell_id = cell["id"]
    if not CELL_ID_RE.fullmatch(cell_id):  # jsonschema's $ lets "x\n" pass
        yield f"cell.id: expected a name matching {CELL_ID_RE.pattern}, got {cell_id!r}"
    prefix = _cell_prefix(report)
    made = f"{prefix}{cell['stack']}-{cell['mode']}-{cell['target']}"
    if cell_id != made:
        yield (f"cell.id: expected {prefix}<stack>-<mode>-<target> = "
               f"{json.dumps(made)}, got {json.dumps(cell_id)}")
    yield from _repeated_case_problems(report)
    cases = {str(c) for c in report["cases"]}
    yield from _inputs_problems(report, cases)
    yield from _numel_problems(report)
    yield from comparison_problems(report, cases)
    yield from pair_problems(report, foreign=False)
    yield from data_problems(report)
    yield from batch_invariance_problems(report)


def foreign_problems(report: Mapping[str, Any]) -> Iterator[str]:
    """Every rule beyond the schema that a foreign report must keep: a case id once,
    :func:`comparison_problems`, :func:`pair_problems` (complete: every implementation
    compared, every listed case in every comparison) and
    :func:`batch_invariance_problems`."""
    yield from _repeated_case_problems(report)
    yield from comparison_problems(report, {str(c) for c in report["cases"]})
    yield from pair_problems(report, foreign=True)
    yield from batch_invariance_problems(report)
