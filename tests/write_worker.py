"""Writes large reports in a loop until it is killed; used by tests/test_interrupted.py.

    python tests/write_worker.py DIR MODE START

Generation ``START``, ``START + 1``, ... of every cell in :data:`CELLS` is written in turn,
each :func:`report` (about 2 MB), with ``runner.reports.store.write_report`` (MODE ``atomic``) or a
plain ``open(path, "w").write`` (MODE ``naive``, the control that shows torn files can be
seen). Prints ``ready`` once imports are done, before the first write, and
``wrote CELL GENERATION`` after each write is whole.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gate_residual_matrix.runner.reports.store import write_report

CELLS = ("host-plain-cpu", "host-plain-cuda", "host-det-cpu")
LINE = "0123456789abcdef" * 4 + "\n"


def report(generation: int, cell_id: str) -> dict:
    """A valid report whose every byte depends on ``generation`` and ``cell_id`` (written as
    version 1 was, then upgraded: what the writer writes)."""
    from gate_residual_matrix.runner.reports.store import upgrade

    stack, mode, target = cell_id.split("-")
    return upgrade({
        "schema_version": 1,
        "kind": "gate_residual_matrix",
        "op": "gate_residual",
        "run_id": f"{generation:032x}",
        "cell": {"id": cell_id, "stack": stack, "mode": mode, "target": target,
                 "backend": "host"},
        "status": "error",
        "reason": f"generation {generation}",
        "log_tail": f"{cell_id} {generation}\n" + LINE * 32_000,
        "exit_code": 1,
        "environment": {},
        "cases": [],
        "results": {},
    })


def generation_of(data: dict) -> int:
    return int(data["run_id"], 16)


def main(directory: str, mode: str, start: int) -> None:
    out = Path(directory)
    print("ready", flush=True)
    generation = start
    while True:
        for cell_id in CELLS:
            doc = report(generation, cell_id)
            if mode == "atomic":
                write_report(doc, out)
            else:
                with open(out / f"{cell_id}.json", "w", encoding="utf-8") as f:
                    f.write(json.dumps(doc, indent=2) + "\n")
            print(f"wrote {cell_id} {generation}", flush=True)
        generation += 1


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
