"""Cells per minute on a local Ray cluster of 1 and of 2 worker nodes (docs/cluster.md).

Starts a head (no CPU) and N worker nodes of one CPU each on this machine
(tests/ray_cluster.py: every process in the node's own process group, all ended at the
end), runs a small CPU matrix of ``--cells`` cells (D = 8, N = 1, 2 and 2 with specials;
eager, numba, fp64; one mode per cell) with ``python -m gate_residual_matrix matrix --cluster ...
--force``, and prints the wall time and cells per minute, beside the same matrix on the
host backend without a cluster.

    python scripts/cluster_local_bench.py --cells 8 --nodes 1 --nodes 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from ray_cluster import LocalCluster  # noqa: E402


def matrix(cells: int) -> dict:
    return {
        "schema_version": 1, "op": "gate_residual",
        "problem": {"D": 8, "G": 2, "dtype": "bfloat16", "index_dtype": "int64", "seed": 17},
        "cases": [{"n": 1}, {"n": 2}, {"n": 2, "specials": True}],
        "implementations": ["eager", "numba", "fp64"], "baseline": "eager",
        "accuracy_reference": "fp64",
        "modes": {f"m{i}": {} for i in range(cells)},
        "stacks": {"host": {"kind": "host"}}, "targets": ["cpu"],
    }


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gate_residual_matrix.runner", "matrix", *argv],
                          cwd=ROOT,
                          capture_output=True, text=True,
                          env={**os.environ, "GATE_RESIDUAL_PROGRESS": "off"})
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"exit {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=8)
    parser.add_argument("--nodes", type=int, action="append")
    parser.add_argument("--client", action="store_true",
                        help="connect through Ray Client (ray://), not the GCS address")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="cluster-bench-"))
    path = work / "matrix.yaml"
    path.write_text(yaml.safe_dump(matrix(args.cells), sort_keys=False), encoding="utf-8")
    common = ["--matrix", str(path), "--force", "--timeout", "600"]
    rows = [("host backend, no cluster", timed([*common, "--backend", "host",
                                               "--reports", str(work / "local")]))]
    for nodes in args.nodes or [1, 2]:
        with LocalCluster() as cluster:
            for i in range(nodes):
                cluster.add_worker(f"w{i}", {"gpu:Test GPU": 1})
            rows.append((f"cluster, {nodes} worker node(s) of 1 CPU", timed(
                [*common, "--cluster",
                 cluster.client_address if args.client else cluster.address,
                 "--reports", str(work / f"nodes{nodes}")])))
    print(f"{args.cells} cells; {'Ray Client' if args.client else 'GCS address'}; load "
          f"average before: {load:.2f}, after: {os.getloadavg()[0]:.2f}; "
          f"{os.cpu_count()} CPUs")
    print("| run | wall (s) | cells per minute |")
    print("| --- | --- | --- |")
    for name, took in rows:
        print(f"| {name} | {took:.1f} | {args.cells / took * 60:.1f} |")


if __name__ == "__main__":
    main()
