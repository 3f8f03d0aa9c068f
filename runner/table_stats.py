"""The tables about each cell: accuracy and determinism, cells, environment, timings, benchmarks.

* :func:`accuracy_table`: per cell, implementation, case and tensor: error against fp64
  (``results[impl].accuracy``), repeatable within a process (``repeatable``), across processes
  (``repeatable_across_processes``) and batch-invariant (``batch_invariant``); the last two may
  be absent from a report and then show ``—``. On the rows of a gradient with one row per
  index value, the fewest and most rows per index value (``inputs[case].index_counts``).
* :func:`cells_table`, :func:`environment_table`, :func:`implementations_table`: every
  readable report with its status and reason, versions and image; implementations that did
  not run.
* :func:`timings_table`: median times (``results[impl].timings``) and effective bandwidth, in
  the bytes per element of each case's own dtype.
* :func:`bench_tables`: any ``reports/bench/*.json`` of the form ``{"title": ..., "rows":
  [{flat}, ...]}``, rendered as it is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ops
from runner import report_tensors
from runner.aggregate import ABSENT, Cell, Filters, Row, Table, ms, num, status_kind, text
from runner.table_ab import image_of
from runner.table_cases import CaseFilter, case_dtypes, cell_dtypes, dtype_label, index_rows

__all__ = ["ITEMSIZE", "LIBRARIES", "accuracy_table", "bench_tables", "cells_table",
           "environment_table", "implementations_table", "timings_table"]

ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}
"""Bytes per element of each storage dtype."""
LIBRARIES = ("triton", "vllm", "sglang", "diffusers", "numba-cuda")
"""Library versions in the environment table (besides torch), from ``environment.libraries``."""

_MAX_REASON = 200
_SHORT_COMMIT = 12
_SHORT_DIGEST = 12
_CASE_N = re.compile(r"^([0-9]+)")


def _short(value: Any, limit: int = _MAX_REASON) -> str:
    line = text(value)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _yes_no(value: Any) -> str:
    """A determinism verdict: bool, or an object of named checks (all must hold)."""
    if value is None:
        return ABSENT
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, Mapping):
        checks = {k: v for k, v in value.items() if isinstance(v, bool)}
        if not checks:
            return ABSENT
        failed = [k for k, v in checks.items() if not v]
        size = value.get("first_failing_size")
        detail = ", ".join(failed) + (f"; first failing size {size}" if size is not None else "")
        return "yes" if not failed else f"NO ({detail})"
    return text(value)


def _batch_invariant(entry: Mapping[str, Any], case: str, tensor: str) -> str:
    """``batch_invariant``: a bool, {check: bool}, or either per case and/or per tensor."""
    value = entry.get("batch_invariant")
    if isinstance(value, Mapping) and case in value:
        value = value[case]
    if isinstance(value, Mapping) and tensor in value:
        value = value[tensor]
    return _yes_no(value)


def _kind(verdict: str) -> str:
    return "eq" if verdict == "yes" else ("diff" if verdict.startswith("NO") else "")


def _index_rows(cell: Cell, case: str, grouped: set[str], tensor: str) -> str:
    """``min–max`` rows per index value of the case, on the rows of the tensors with one row
    per index value (``grouped``) only."""
    found = index_rows(cell, case) if tensor in grouped else None
    return ABSENT if found is None else f"{found[0]}–{found[1]}"


def _grouped(cell: Cell) -> set[str]:
    """The report's tensors with one row per index value (shape[0] is the index's size)."""
    groups = report_tensors.index_groups(cell.data)
    return {k for k, v in report_tensors.table(cell.data).items()
            if (v.get("shape") or [None])[0] == groups}


def accuracy_table(cells: Sequence[Cell], filters: Filters | None = None) -> Table:
    """Per cell x implementation x case x tensor: error vs fp64 and the determinism checks;
    on a per-index-value gradient's rows, the fewest and most rows that one of its rows sums."""
    filters = filters or Filters()
    by_dtype = CaseFilter.of(filters)
    rows, without = [], []
    for cell in cells:
        before = len(rows)
        names, grouped = report_tensors.labels(cell.data), _grouped(cell)
        for impl, entry in cell.results.items():
            if not filters.keeps_impl(impl):
                continue
            acc = entry.get("accuracy") or {}
            rep = entry.get("repeatable") or {}
            across = entry.get("repeatable_across_processes") or {}
            keys = list(dict.fromkeys([*acc, *rep, *across]))
            cases = cell.in_order(keys)
            for case in by_dtype.cases(cell, cases):
                figures = {"out": (acc.get(case) or {}).get("out"),
                           **((acc.get(case) or {}).get("grads") or {})}
                for tensor in names:
                    fig = figures.get(tensor) or {}
                    verdicts = [_yes_no((rep.get(case) or {}).get(tensor)),
                                _yes_no((across.get(case) or {}).get(tensor)),
                                _batch_invariant(entry, case, tensor)]
                    if not fig and verdicts[:2] == [ABSENT, ABSENT]:
                        continue
                    ulps = fig.get("max_abs_ulps")
                    over = ulps == "inf" or (isinstance(ulps, (int, float)) and ulps > 1)
                    rows.append(Row((cell.label, impl, case, dtype_label(cell, case), tensor,
                                     num(fig.get("max_abs")), num(fig.get("max_rel")), num(ulps),
                                     _index_rows(cell, case, grouped, tensor), *verdicts),
                                    cell.index,
                                    ("",) * 7 + ("warn" if over else "", "")
                                    + tuple(map(_kind, verdicts))))
        if len(rows) == before and cell.ours:
            without.append(f"{cell.label} ({cell.status})")
    footer = [f"Cells without timings: {'; '.join(without)}."] if without else []
    shared = [f"{cell.label} ({why})" for cell in cells if (why := _shared_cores(cell))]
    if shared:
        footer.append("Timed on shared cores (1-minute load average above the CPUs the cell "
                      f"could use), so their times are not comparable: {'; '.join(shared)}.")
    return Table(
        "accuracy", "Accuracy vs fp64 and determinism",
        ("cell", "impl", "case", "dtype", "tensor", "max_abs", "max_rel", "err ULP vs fp64",
         "rows per index", "repeatable", "across processes", "batch-invariant"), rows,
        note="Each implementation against the float64 reference: `max_abs`, `max_rel` "
             "(over elements with a non-zero reference) and `err ULP vs fp64` (`max_abs_ulps`: "
             "max_abs in ULPs of the storage dtype at the largest |reference|; above 1 is marked "
             "in the HTML page; not the bitwise table's `max ULP apart`, a distance between two "
             "implementations). `rows per index`, on a gradient with one row per index value "
             "(an AdaLN row's: " + (_grouped_labels(cells) or "none") + "): the fewest and "
             "most rows of the case that share one index value (`inputs[case]."
             "index_counts`), which one of its elements sums, so its error grows with them. "
             "`repeatable`: the same bits in every repeat within one process; `across "
             "processes`: the same bits in separate processes; `batch-invariant`: rows "
             "computed alone, in sub-batches and in the full batch agree. `—`: the report "
             "has no such figure.",
        empty="No accuracy figures.",
        footer=f"Cells without figures: {'; '.join(without)}." if without else "")


def _commit(cell: Cell) -> str:
    project = cell.environment.get("project") or {}
    commit, dirty = project.get("commit"), project.get("dirty")
    if commit is None and not cell.ours:
        # The reference report names its project's commit at the top, e.g. rl_kernel_commit.
        commit = next((v for k, v in cell.data.items()
                       if k.endswith("_commit") and isinstance(v, str)), None)
        dirty = cell.data.get("tracked_tree_dirty")
    if not commit:
        return ABSENT
    return str(commit)[:_SHORT_COMMIT] + (" (dirty)" if dirty else "")


def _file(cell: Cell, relative_to: Path | None) -> str:
    path = cell.report.path
    if relative_to is not None:
        try:
            path = path.resolve().relative_to(Path(relative_to).resolve())
        except ValueError:
            pass
    return path.as_posix()


def time_spent(data: dict, top: int = 3) -> str:
    """``"98 s: compile 41, batch inv. 20, inputs 9"``: a report's wall time and its
    largest phases in seconds (``phases``, runner/phases.py); the total alone without them,
    ``—`` without either. ``compile`` is the part of the others spent compiling."""
    total = data.get("duration_s")
    if not isinstance(total, (int, float)):
        return ABSENT
    phases = data.get("phases")
    if not isinstance(phases, dict):
        return f"{total:.0f} s"
    spent = {k: v for k, v in phases.items() if isinstance(v, (int, float)) and v > 0
             and k != "other"}
    runs = phases.get("runs")
    if isinstance(runs, dict):
        spent["runs"] = sum(v for v in runs.values() if isinstance(v, (int, float)))
    names = {"compilation": "compile", "batch_invariance": "batch inv.",
             "comparisons": "compare"}
    biggest = sorted(spent.items(), key=lambda kv: -kv[1])[:top]
    return f"{total:.0f} s: " + ", ".join(f"{names.get(k, k)} {v:.0f}" for k, v in biggest)


def cells_table(cells: Sequence[Cell], relative_to: Path | None = None) -> Table:
    """One row per readable report: what it is, its status and reason, where its time went,
    commit and file."""
    rows = [Row((c.label, c.origin, c.facet("stack"), c.facet("mode"), c.facet("target"),
                 ", ".join(cell_dtypes(c)) or ABSENT, c.status, _short(c.reason or ABSENT),
                 time_spent(c.data), _commit(c), _file(c, relative_to)), c.index,
                ("", "", "", "", "", "", status_kind(c.status)))
            for c in cells]
    return Table("cells", "Cells", ("cell", "origin", "stack", "mode", "target", "dtypes",
                                    "status", "reason", "time", "project commit", "file"), rows,
                 note="Every readable report, whatever its status; `foreign`: another "
                      "project's report (the reference layout), read where it can be. "
                      "`dtypes`: the storage dtypes of the cell's cases. `time`: the cell's "
                      "wall time and its three largest phases in seconds (report `phases`; "
                      "`compile` is the part of the others spent compiling, `runs` the "
                      "implementations' repeated calls).",
                 empty="No reports.")


def _digest(digest: str | None) -> str:
    if not digest:
        return ABSENT
    algo, _, hexpart = digest.rpartition("@")[2].rpartition(":")
    return (f"{algo}:" if algo else "") + hexpart[:_SHORT_DIGEST]


def environment_table(cells: Sequence[Cell]) -> Table:
    """Per cell: GPU, capability, driver, CUDA, Python, torch, libraries, image, status."""
    rows = []
    for c in cells:
        env = c.environment
        libs = env.get("libraries") or {}
        cap = env.get("capability")
        tag, digest = image_of(c.data)
        rows.append(Row((c.label, c.status, c.facet("gpu"),
                         ".".join(map(str, cap)) if cap else ABSENT,
                         *(num(env.get(k)) for k in ("driver", "cuda", "python", "torch")),
                         *(num(libs.get(k)) for k in LIBRARIES), num(tag), _digest(digest)),
                        c.index, ("", status_kind(c.status))))
    return Table("environment", "Environment",
                 ("cell", "status", "GPU", "capability", "driver", "CUDA", "Python", "torch",
                  *LIBRARIES, "image", "digest or id"), rows,
                 note="Versions as the cell saw them (`—`: not installed or not recorded); "
                      "image tag and digest for cells run in a container.",
                 empty="No reports.")


def implementations_table(cells: Sequence[Cell], filters: Filters | None = None) -> Table:
    """Implementations whose status is not ok, with the reason."""
    filters = filters or Filters()
    rows = [Row((c.label, impl, str(e.get("status")), _short(e.get("reason") or ABSENT)),
                c.index, ("", "", status_kind(str(e.get("status")))))
            for c in cells for impl, e in c.results.items()
            if e.get("status") not in (None, "ok") and filters.keeps_impl(impl)]
    return Table("implementations", "Implementations that did not run",
                 ("cell", "impl", "status", "reason"), rows,
                 empty="Every implementation in every cell ran (status ok or not recorded).",
                 level=3)


def _rows_of(cell: Cell, case: str) -> int | None:
    n = ((cell.data.get("inputs") or {}).get(case) or {}).get("n")
    match = _CASE_N.match(case)
    return n if isinstance(n, int) else (int(match.group(1)) if match else None)


def _bytes_moved(cell: Cell, n: int, itemsize: int) -> tuple[int, int] | None:
    """(forward, forward+backward) bytes the cell's op must move for ``n`` rows (its spec's
    ``bytes_moved``; a foreign report is the first op's), or None without its sizes."""
    op = cell.op if cell.op in ops.OPS else ops.OPS[0]
    spec = ops.get(op)
    problem = cell.data.get("problem") or {}
    sizes = {k: problem.get(k) for k in spec.sizes}
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in sizes.values()):
        return None
    return spec.bytes_moved(n, sizes, itemsize)


def _grouped_labels(cells: Sequence[Cell]) -> str:
    """The labels of the per-index-value gradients of the cells' ops (``grad_gate``)."""
    found: dict[str, None] = {}
    for cell in cells:
        names = report_tensors.labels(cell.data)
        found.update(dict.fromkeys(f"`{names[k]}`" for k in sorted(_grouped(cell))))
    return ", ".join(found)


def _bytes_notes(cells: Sequence[Cell]) -> str:
    """Each op's bytes formula (its spec's first note), named by op when there are several."""
    found = list(dict.fromkeys(c.op if c.op in ops.OPS else ops.OPS[0] for c in cells)) or [
        ops.OPS[0]]
    notes = {op: (ops.get(op).notes or ("",))[0] for op in found}
    if len(notes) == 1:
        return next(iter(notes.values()))
    return " ".join(f"{op}: {note}" for op, note in notes.items())


def _gbps(nbytes: int | None, ms: Any) -> str:
    if nbytes is None or not isinstance(ms, (int, float)) or isinstance(ms, bool) or ms <= 0:
        return ABSENT
    rate = nbytes / (ms * 1e6)
    return f"{rate:.0f}" if rate >= 100 else f"{rate:.3g}"


def timings_table(cells: Sequence[Cell], filters: Filters | None = None) -> Table:
    """Per cell x implementation x case: median forward and forward+backward times, GB/s."""
    filters = filters or Filters()
    by_dtype = CaseFilter.of(filters)
    rows, without = [], []
    for cell in cells:
        before = len(rows)
        for impl, entry in cell.results.items():
            timings = entry.get("timings") or {}
            if not filters.keeps_impl(impl):
                continue
            cases = cell.in_order(timings)
            for case in by_dtype.cases(cell, cases):
                t = timings[case] or {}
                n = _rows_of(cell, case)
                size = ITEMSIZE.get(case_dtypes(cell, case)[0] or "")
                moved = (_bytes_moved(cell, n, size) if n and size
                         and entry.get("role") != "accuracy_reference" else None)
                fwd, both = moved or (None, None)
                f_ms, b_ms = t.get("forward_ms"), t.get("forward_backward_ms")
                rows.append(Row((cell.label, impl, case, dtype_label(cell, case), num(n),
                                 ms(f_ms), _gbps(fwd, f_ms), ms(b_ms), _gbps(both, b_ms)),
                                cell.index))
        if len(rows) == before and cell.ours:
            without.append(f"{cell.label} ({cell.status})")
    footer = [f"Cells without timings: {'; '.join(without)}."] if without else []
    shared = [f"{cell.label} ({why})" for cell in cells if (why := _shared_cores(cell))]
    if shared:
        footer.append("Timed on shared cores (1-minute load average above the CPUs the cell "
                      f"could use), so their times are not comparable: {'; '.join(shared)}.")
    return Table(
        "timings", "Timings", ("cell", "impl", "case", "dtype", "N", "forward ms",
                               "forward GB/s", "fwd+bwd ms", "fwd+bwd GB/s"), rows,
        note="Medians over the timed iterations (CUDA events on a GPU). Effective bandwidth = "
             "bytes that must move / median time, GB/s = 1e9 B/s, with s the storage dtype's "
             "bytes per element: " + _bytes_notes(cells),
        empty="No timings.",
        footer=" ".join(footer))


def _shared_cores(cell: Cell) -> str:
    """"load 2.7 on 2 CPUs" where the cell's recorded load average (start or end) exceeded
    the CPUs it could use, else "". Reports without these fields (older ones, foreign ones)
    give ""."""
    env = cell.data.get("environment") or {}
    cpus, load = env.get("cpus_available"), env.get("load_average") or {}
    peaks = [v for v in (load.get("start"), load.get("end")) if isinstance(v, (int, float))]
    if not isinstance(cpus, int) or not peaks or max(peaks) <= cpus:
        return ""
    return f"load {max(peaks):g} on {cpus} CPUs"


def _bench_value(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return num(value)


def bench_tables(bench_dir: Path) -> tuple[list[Table], list[tuple[Path, str]]]:
    """Each ``<bench_dir>/*.json`` as a table; files that are not ``{"rows": [{...}]}`` are
    returned as (path, problem) instead of raising."""
    tables: list[Table] = []
    problems: list[tuple[Path, str]] = []
    paths = sorted(Path(bench_dir).glob("*.json")) if Path(bench_dir).is_dir() else []
    for path in paths:
        name = f"{Path(bench_dir).name}/{path.name}"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            problems.append((path, f"not readable as JSON: {_short(err)}"))
            continue
        rows = data.get("rows") if isinstance(data, dict) else None
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            problems.append((path, 'not a benchmark: expected {"rows": [{...}, ...]}'))
            continue
        headers = tuple(dict.fromkeys(k for r in rows for k in r))
        title = text(data.get("title") or path.stem)
        tables.append(Table(f"bench-{path.stem}", title, headers,
                            [Row(tuple(_bench_value(r.get(h)) for h in headers)) for r in rows],
                            note=f"From `{name}`.", empty="No rows.", level=3))
    return tables, problems
