"""Time the tables over many cell reports: synthesise N reports, then read and render them.

Usage::

    python scripts/bench_tables.py            # 1,000 reports
    python scripts/bench_tables.py --cells 200 --keep /tmp/many
    python scripts/bench_tables.py --cells 200 --template reports/host-plain-cpu.json
    python scripts/bench_tables.py --cells 1 --cases 20000   # one huge report

The reports are copies of a real report (by default the H200 one in
tests/data/h200/host-plain-cuda.json: five cases, three implementations; ``--template`` takes
another, e.g. a cell of today's default matrix) with their cell ids, stacks, modes, torch
versions and some hashes changed; one in twenty has status ``error`` and no results. They are
written to a temporary directory, then timed: reading and validating
(:func:`runner.reports.store.read_reports`), building the tables, rendering each output, and
:func:`runner.tables.write_tables` end to end. Prints one line per phase (seconds) and the
output sizes. A benchmark, not a test; the figures are quoted in docs/tables.md.
``--cases K`` first grows the template to K cases (:func:`huge`): N = 1..K, each a copy of its
case 257 with the counts that N asks for, so every report is valid and K cases long.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gate_residual_matrix.runner.reports.store import read_reports  # noqa: E402
from gate_residual_matrix.runner.tables import OUTPUTS, build_tables, markdown, write_tables  # noqa: E402
from gate_residual_matrix.runner.tables.render import html, summary  # noqa: E402

TEMPLATE = ROOT / "tests" / "data" / "h200" / "host-plain-cuda.json"
TORCH = ("2.11.0", "2.12.1", "2.13.0", "2.14.0")
MODES = ("plain", "deterministic", "tf32", "compile", "inference")


def _rescale(value, n: int, d: int, key: str = ""):
    """A copy of one case's per-case value (case 257) for N = ``n`` rows: every CMP's
    ``numel`` (N x D except ``gate``) and counts, every ``finite`` count, hashes per N."""
    if isinstance(value, dict):
        out = {k: _rescale(v, n, d, k if k in ("out", "res", "y", "gate") else key)
               for k, v in value.items()}
        rows = n * d if key != "gate" else value.get("numel", value.get("finite"))
        if "numel" in out:
            out["numel"] = rows
            out["differ"] = min(out["differ"], rows)
            for k in ("nan_differ", "nan_payload_differ"):
                if k in out:
                    out[k] = min(out[k], out["differ"])
            if out.get("first_differ") is not None:
                out["first_differ"] = min(out["first_differ"], rows - 1)
        if "finite" in out:
            out["finite"] = rows
        return out
    if isinstance(value, list):
        return [_rescale(v, n, d, key) for v in value]
    if isinstance(value, str) and len(value) == 64:
        return hashlib.sha256(f"{value}/{n}".encode()).hexdigest()
    return value


def huge(template: dict, cases: int) -> dict:
    """``template`` (a report with a case 257) grown to ``cases`` cases, N = 1..``cases``."""
    report = copy.deepcopy(template)
    d, g = report["problem"]["D"], report["problem"]["G"]
    report["cases"] = list(range(1, cases + 1))
    one = report["inputs"]["257"]
    report["inputs"] = {}
    for n in report["cases"]:
        counts = [n // g + (i < n % g) for i in range(g)]
        report["inputs"][str(n)] = {**_rescale(one, n, d), "n": n, "index_counts": counts}
    for entry in report["results"].values():
        for key, by_case in entry.items():
            if isinstance(by_case, dict) and "257" in by_case:
                entry[key] = {str(n): _rescale(by_case["257"], n, d, "")
                              for n in report["cases"]}
    return report


def synthesise(directory: Path, count: int, source: Path = TEMPLATE,
               cases: int | None = None) -> None:
    """Write ``count`` reports derived from the report ``source`` into ``directory``
    (each grown to ``cases`` cases by :func:`huge` when given)."""
    template = json.loads(source.read_text(encoding="utf-8"))
    if cases is not None:
        template = huge(template, cases)
    for i in range(count):
        report = copy.deepcopy(template)
        stack, mode = f"stack{i // (2 * len(MODES)):03d}", MODES[i % len(MODES)]
        target = ("cuda", "cpu")[(i // len(MODES)) % 2]
        report["cell"].update(id=f"{stack}-{mode}-{target}", stack=stack, mode=mode,
                              target=target, backend="docker")
        torch = TORCH[(i // (2 * len(MODES))) % len(TORCH)]
        report["environment"]["torch"] = f"{torch}+cu130"
        report["environment"]["libraries"]["torch"] = torch
        if i % 20 == 19:
            report.update(status="error", reason="RuntimeError: synthetic failure",
                          log_tail="Traceback ...\nRuntimeError: synthetic failure\n",
                          exit_code=1, results={})
        elif torch != TORCH[0]:
            for case, tensors in report["results"]["eager"]["sha256"].items():
                tensors["gate"] = hashlib.sha256(f"{torch}/{case}".encode()).hexdigest()
        path = directory / f"{report['cell']['id']}.json"
        path.write_text(json.dumps(report, indent=2), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=1000, help="reports to synthesise")
    parser.add_argument("--keep", type=Path, help="write them here and keep them")
    parser.add_argument("--template", type=Path, default=TEMPLATE,
                        help="the report to copy (default: %(default)s)")
    parser.add_argument("--cases", type=int, help="grow each report to this many cases")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.keep or Path(tmp) / "reports"
        directory.mkdir(parents=True, exist_ok=True)
        synthesise(directory, args.cells, args.template, args.cases)
        size = sum(p.stat().st_size for p in directory.glob("*.json"))
        print(f"{args.cells} reports of {args.template.name}, {size / 1e6:.1f} MB, "
              f"in {directory}; load average {os.getloadavg()[0]:.2f}")
        timings = {}
        start = time.perf_counter()
        reports = read_reports(directory)
        timings["read + validate"] = time.perf_counter() - start
        start = time.perf_counter()
        tables = build_tables(reports, relative_to=directory, bench_dir=directory / "bench")
        timings["build tables"] = time.perf_counter() - start
        for name, render in (("README.md", markdown), ("index.html", html.render_html),
                             ("summary.csv", summary.render_csv),
                             ("summary.json", summary.render_json)):
            start = time.perf_counter()
            text = render(tables)
            timings[f"render {name} ({len(text.encode()) / 1e6:.1f} MB)"] = (
                time.perf_counter() - start)
        start = time.perf_counter()
        write_tables(directory)
        timings["write_tables end to end (read, build, render, write)"] = (
            time.perf_counter() - start)
        for phase, seconds in timings.items():
            print(f"{seconds:8.2f} s  {phase}")
        bad = [r for r in reports if not r.ok]
        print(f"unreadable: {len(bad)}; outputs: {', '.join(OUTPUTS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
