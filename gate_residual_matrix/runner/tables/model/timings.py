"""The tables about time: each cell's median times and bandwidth, and the benchmark files.

* :func:`timings_table`: median times (``results[impl].timings``) and effective bandwidth, in
  the bytes per element of each case's own dtype and the bytes its op's spec says it moves.
* :func:`bench_tables`: any ``reports/bench/*.json`` of the form ``{"title": ..., "rows":
  [{flat}, ...]}``, rendered as it is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gate_residual_matrix import ops
from gate_residual_matrix.runner.tables.model.cases import (
    ITEMSIZE,
    CaseFilter,
    case_dtypes,
    dtype_label,
)
from gate_residual_matrix.runner.tables.model.cells import CellReport
from gate_residual_matrix.runner.tables.model.filters import Filters
from gate_residual_matrix.runner.tables.model.table import Row, Table
from gate_residual_matrix.runner.tables.model.values import ABSENT, ms, num, short, text

__all__ = ["bench_tables", "timings_table"]

_CASE_N = re.compile(r"^([0-9]+)")


def _rows_of(cell: CellReport, case: str) -> int | None:
    n = ((cell.data.get("inputs") or {}).get(case) or {}).get("n")
    match = _CASE_N.match(case)
    return n if isinstance(n, int) else (int(match.group(1)) if match else None)


def _bytes_moved(cell: CellReport, n: int, itemsize: int) -> tuple[int, int] | None:
    """(forward, forward+backward) bytes the cell's op must move for ``n`` rows (its spec's
    ``bytes_moved``; a foreign report is the first op's), or None without its sizes."""
    op = cell.op if cell.op in ops.OPS else ops.OPS[0]
    spec = ops.get(op)
    problem = cell.data.get("problem") or {}
    sizes = {k: v for k in spec.sizes
             if isinstance(v := problem.get(k), int) and not isinstance(v, bool)}
    if len(sizes) != len(spec.sizes):
        return None
    return spec.bytes_moved(n, sizes, itemsize)


def _bytes_notes(cells: Sequence[CellReport]) -> str:
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


def timings_table(cells: Sequence[CellReport], filters: Filters | None = None) -> Table:
    """Per cell x implementation x case: median forward and forward+backward times, GB/s."""
    filters = filters or Filters()
    by_dtype = CaseFilter.of(filters)
    rows: list[Row] = []
    without: list[str] = []
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


def _shared_cores(cell: CellReport) -> str:
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
            problems.append((path, f"not readable as JSON: {short(err)}"))
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
