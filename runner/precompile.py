"""Compile ahead, in parallel: shape-specialising implementations get their graphs built by
worker processes before a cell's cases run (issue 11).

``torch.compile(..., dynamic=False)`` (``compiled``, ``compiled_emulate``) compiles one
program per input shape and dtype: a default ``cuda`` cell calls each with about 35 row
counts in 6 dtype pairs (the cases and :func:`runner.batch_invariance.row_counts`), forward
with and without autograd, about 800 graphs, which one process compiles one after another
(129 s of a 420 s partial run on the H200, 2026-12-01). Compilation is deterministic and
inductor keeps what it compiles in its on-disk caches (FX graph, AOTAutograd and Triton
caches, keyed by the graph, the shapes, the settings and the versions), so worker processes
started with the cell's environment and torch settings compile the same programs into the
same cache, in parallel, and the cell then loads them: the code under test is the one it
would have compiled itself.

The workers run before the first case and are waited for (bounded by ``timeout_s``), so no
compilation competes with the cell's timing loops. A worker that fails costs only time: the
cell compiles what is missing itself. ``environment.precompile`` in the report records what
was done.

Usage (what :func:`run` starts)::

    python -m runner.precompile PLAN.json

``GATE_RESIDUAL_PRECOMPILE=0`` turns it off (the cell then compiles everything itself);
``=N`` asks for N workers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runner.batch_invariance import row_counts

MAX_WORKERS = 12


def plan(matrix, cases, impls, *, target: str, inference: bool) -> list[dict]:
    """The calls that compile every graph the cell will need, in the cases' order:
    ``{"impl", "dtype", "index_dtype", "rows", "grad"}`` with ``grad`` one of ``train``
    (forward + backward), ``no_grad`` (the timing loop's forward) or ``inference``
    (under ``torch.inference_mode()``). ``impls``: those that compile per shape."""
    items, seen = [], set()
    for case in cases:
        dtype, index_dtype = matrix.case_dtypes(case)
        if inference:
            wanted = [(case.n, "inference"), (case.n, "no_grad")]
        else:
            rows = {case.n}
            if matrix.batch_invariance is not None:
                rows |= row_counts(case.n, matrix.batch_invariance.max_size)
            wanted = [(r, "train") for r in sorted(rows)] + [(case.n, "no_grad")]
        for impl in impls:
            for rows_, grad in wanted:
                key = (impl.name, dtype, index_dtype, rows_, grad)
                if key not in seen:
                    seen.add(key)
                    items.append(dict(zip(("impl", "dtype", "index_dtype", "rows", "grad"),
                                          key, strict=True)))
    return items


def workers_for(items: list, cpus: int | None) -> int:
    """How many worker processes: one per spare CPU (two kept for the cell and the system),
    at most :data:`MAX_WORKERS` and the number of calls; 0 when fewer than 2 would run.
    ``GATE_RESIDUAL_PRECOMPILE=N`` sets the number (0: off)."""
    forced = os.environ.get("GATE_RESIDUAL_PRECOMPILE", "")
    if forced.isdigit():  # "0": off; "N": N workers whatever the CPUs (tests)
        return min(int(forced), len(items))
    n = min(MAX_WORKERS, max((cpus or 1) - 2, 0), len(items))
    return n if n >= 2 else 0


def run(items: list[dict], *, torch_settings: dict, d: int, g: int, target: str,
        workers: int, timeout_s: float = 300.0) -> dict:
    """Run the calls of ``items`` in ``workers`` processes (round robin, so each starts with
    the first cases) and wait for them, at most ``timeout_s``; returns the record for
    ``environment.precompile``: workers, calls, seconds, and the workers that failed."""
    started = time.perf_counter()
    procs = []
    with tempfile.TemporaryDirectory(prefix="gate-residual-precompile-") as tmp:
        for w in range(workers):
            part = items[w::workers]
            path = Path(tmp) / f"plan-{w}.json"
            path.write_text(json.dumps({"torch": torch_settings, "D": d, "G": g,
                                        "target": target, "calls": part}), encoding="utf-8")
            procs.append(subprocess.Popen([sys.executable, "-m", "runner.precompile", str(path)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                          text=True, errors="replace"))
        failed = []
        for w, proc in enumerate(procs):
            left = max(timeout_s - (time.perf_counter() - started), 1.0)
            try:
                _, err = proc.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
                failed.append(f"worker {w}: timed out after {timeout_s:g} s")
                continue
            if proc.returncode:
                last = (err or "").strip().splitlines()[-1:] or [""]
                failed.append(f"worker {w}: exit code {proc.returncode}: {last[0][:200]}")
    return {"workers": workers, "calls": len(items),
            "seconds": round(time.perf_counter() - started, 3), "failed": failed}


def _inputs(call: dict, d: int, g: int, device: str) -> dict:
    import torch

    from runner.inputs import INDEX_DTYPES, TORCH_DTYPES

    dt, n = TORCH_DTYPES[call["dtype"]], call["rows"]
    return {"residual": torch.zeros(n, d, dtype=dt, device=device),
            "gate": torch.zeros(g, d, dtype=dt, device=device),
            "y": torch.zeros(n, d, dtype=dt, device=device),
            "index": torch.zeros(n, dtype=INDEX_DTYPES[call["index_dtype"]], device=device),
            "grad_out": torch.zeros(n, d, dtype=dt, device=device)}


def main(argv: list[str]) -> int:
    """Worker: apply the mode's torch settings, then make each call of the plan file once."""
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    import torch

    from runner import implementations, modes
    from runner.config import TorchSettings

    modes.apply_torch_settings(TorchSettings(**spec["torch"]))
    device = "cuda" if spec["target"] == "cuda" else "cpu"
    for call in spec["calls"]:
        impl = implementations.get(call["impl"])
        x = _inputs(call, spec["D"], spec["G"], device)
        if call["grad"] == "inference":
            with torch.inference_mode():
                impl.run(x, backward=False)
        else:
            impl.run(x, backward=call["grad"] == "train")
    if device == "cuda":
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
