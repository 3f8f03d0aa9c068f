"""How good the time-left estimates were: read a main job's plain progress lines
(``GATE_RESIDUAL_PROGRESS=plain``, as in a pipe or a log) and compare every "about X left"
with the time the cell then really took to its "done" line, and every job estimate (the
``job: k of n cells done, elapsed E, about X left`` a cell starts with) with the time to the
job's last cell's "done" (that cell's start plus its own elapsed time).

    nox -s matrix 2>&1 | tee matrix.log
    python scripts/eta_accuracy.py matrix.log [--within 0.25]

Prints one row per estimate (cell, case k/n, estimated and actual seconds left, the error as
a fraction of the actual) and a last line: how many estimates were within ``--within`` of
what followed. Estimates whose actual time left is under 10 s are listed but not counted (a
line's durations are rounded to the second). Exit 0; 2 when the log holds no estimate.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from tabulate import tabulate

LINE = re.compile(r"\[runner\] (?P<cell>\S+): case (?P<case>\d+)/(?P<of>\d+) \((?P<id>[^)]*)\) "
                  r"[\d.]+ s; elapsed (?P<elapsed>[^,]+), (?P<left>done|about (?P<eta>.+) left)$")
JOB = re.compile(r"\[runner\] cell (?P<cell>\S+): .*; job: (?P<k>\d+) of (?P<n>\d+) cells done, "
                 r"elapsed (?P<elapsed>[^,(]+?)(?:, about (?P<eta>[^(]+?) left)?(?: \(.*\))?$")
UNIT = re.compile(r"(\d+) (h|min|s)\b")
SECONDS = {"h": 3600, "min": 60, "s": 1}
TOO_SHORT_S = 10.0


def seconds(text: str) -> float:
    """``"3 min 05 s"`` -> 185.0 (the runner's :func:`runner.cell.progress.duration`)."""
    parts = UNIT.findall(text)
    if not parts:
        raise ValueError(f"not a duration: {text!r}")
    return float(sum(int(n) * SECONDS[u] for n, u in parts))


def estimates(lines) -> list[dict]:
    """Each estimate of the log with the cell's final elapsed time: ``cell``, ``case``,
    ``eta_s``, ``actual_s`` (None where the cell never printed ``done``)."""
    found, done = [], {}
    for raw in lines:
        m = LINE.search(raw.rstrip("\n"))
        if not m:
            continue
        elapsed = seconds(m["elapsed"])
        if m["left"] == "done":
            done[m["cell"]] = elapsed
        else:
            found.append({"cell": m["cell"], "case": f"{m['case']}/{m['of']}",
                          "elapsed_s": elapsed, "eta_s": seconds(m["eta"])})
    for e in found:
        end = done.get(e["cell"])
        e["actual_s"] = None if end is None else end - e["elapsed_s"]
    return found


def job_estimates(lines) -> list[dict]:
    """Each job estimate of the log: ``cell`` (the one starting), ``case`` (``k/n`` cells
    done), ``eta_s`` and ``actual_s`` (None when the log has no last cell's "done")."""
    found, last, done = [], None, {}
    for raw in lines:
        line = raw.rstrip("\n")
        m = JOB.search(line)
        if m:
            last = (m["cell"], seconds(m["elapsed"]))
            if m["eta"]:
                found.append({"cell": m["cell"], "case": f"{m['k']}/{m['n']} cells",
                              "elapsed_s": last[1], "eta_s": seconds(m["eta"])})
            continue
        c = LINE.search(line)
        if c and c["left"] == "done":
            done[c["cell"]] = seconds(c["elapsed"])
    end = None if last is None or last[0] not in done else last[1] + done[last[0]]
    for e in found:
        e["actual_s"] = None if end is None else end - e["elapsed_s"]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--within", type=float, default=0.25)
    args = parser.parse_args(argv)
    rows, counted, good = [], 0, 0
    lines = args.log.read_text(encoding="utf-8", errors="replace").splitlines()
    for e in [*estimates(lines), *job_estimates(lines)]:
        actual = e["actual_s"]
        error = None if not actual else (e["eta_s"] - actual) / actual
        if actual is not None and actual >= TOO_SHORT_S:
            counted += 1
            good += abs(error) <= args.within
        rows.append([e["cell"], e["case"], e["eta_s"], actual,
                     "" if error is None else f"{error:+.0%}"])
    if not rows:
        print(f"{args.log}: no time-left estimate in it (plain progress lines)", file=sys.stderr)
        return 2
    print(tabulate(rows, headers=["cell", "case", "estimated s", "actual s", "error"]))
    print(f"{good} of {counted} estimates with >= {TOO_SHORT_S:.0f} s left were within "
          f"{args.within:.0%} of the time that followed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
