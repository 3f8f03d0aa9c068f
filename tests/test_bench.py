"""The benchmark's code path, once, on tiny CPU shapes (``--smoke``), so that it cannot rot.

No figure from this run means anything; the H200 figures come from ``bash scripts/h200.sh``.
"""

from __future__ import annotations

import json

from runner import bench


def test_bench_smoke_writes_rows_for_eager_and_numba(tmp_path, capsys):
    assert bench.main(["--smoke", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("bench-*-smoke.json")
    doc = json.loads(path.read_text())
    assert doc["device"] == "cpu" and doc["copy_GBps"] > 0
    rows = {(r["dtype"], r["N"], r["impl"]): r for r in doc["rows"]}
    for n in (1, 257):
        for impl in ("eager", "numba"):
            row = rows[("bfloat16", n, impl)]
            assert row["forward_ms"] > 0 and row["forward_backward_ms"] > 0, row
            assert row["forward_copy_fraction"] > 0
        assert rows[("bfloat16", n, "eager")]["forward_vs_eager"] == 1.0
    assert "wrote" in capsys.readouterr().out


def test_bench_without_a_gpu_refuses_rather_than_writing_cpu_figures(tmp_path):
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(SystemExit) as info:
        bench.main(["--out", str(tmp_path)])
    assert info.value.code == 2 and not list(tmp_path.iterdir())
