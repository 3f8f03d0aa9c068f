"""The benchmark's code path, once, on tiny CPU shapes (``--smoke``), so that it cannot rot.

No figure from this run means anything; the H200 figures come from
``ops.gate_residual.bench`` on the GPU (docs/performance.md).
"""

from __future__ import annotations

import json

import pytest
import torch

from ops.gate_residual import bench


def test_bench_smoke_writes_rows_peers_host_costs_and_a_table(tmp_path, capsys):
    assert bench.main(["--smoke", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("bench-*-smoke.json")
    doc = json.loads(path.read_text())
    assert doc["device"] == "cpu" and doc["copy_GBps"] > 0
    rows = {(r["dtype"], r["N"], r["impl"]): r for r in doc["rows"]}
    for n in (1, 257):
        for impl in ("eager", "numba"):
            row = rows[("bfloat16", n, impl)]
            assert row["forward_ms"] > 0 and row["forward_backward_ms"] > 0, row
            assert row["forward_copy_fraction"] > 0 and row["D"] == 64 and row["G"] == 3
        assert rows[("bfloat16", n, "eager")]["forward_vs_eager"] == 1.0
        assert max(r.get("forward_vs_fastest", 0) for (_, m, _), r in rows.items()
                   if m == n) == 1.0
    assert rows[("bfloat16", 257, "numba backward alone")]["backward_ms"] > 0
    peers = {p["name"]: p for p in doc["peers"]}
    for name in ("rl_kernel_h3", *bench.LIBRARIES):  # CUDA only: named, with the reason
        assert "does not run on target 'cpu'" in peers[name]["unavailable"], peers[name]
    host = doc["host_overhead_us"]["per_call_us"]
    assert "no-op C function" in doc["host_overhead_us"]["how"]
    for key in ("forward", "forward.packed_launch", "backward", "backward.chunk_launch"):
        assert host[key] > 0, key
    table = path.with_suffix(".md").read_text()
    assert "| bfloat16 | 257 | numba |" in table and "## Host time per call" in table
    assert "wrote" in capsys.readouterr().out


def test_a_peer_that_raises_is_a_row_with_the_error():
    def broken(*_):
        raise RuntimeError("no kernel image\nsecond line")

    peer = bench.Peer("broken", "test", broken, broken)
    x = {k: torch.ones(2, 4) for k in ("residual", "y", "grad_out")}
    x.update(gate=torch.ones(1, 4), index=torch.zeros(2, dtype=torch.int64))
    row = bench.time_peer(peer, [x], "float32", 2, "cpu", iters=2, warmup=1)
    assert row == {"error": "RuntimeError: no kernel image"}


def test_bench_without_a_gpu_refuses_rather_than_writing_cpu_figures(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(SystemExit) as info:
        bench.main(["--out", str(tmp_path)])
    assert info.value.code == 2 and not list(tmp_path.iterdir())
