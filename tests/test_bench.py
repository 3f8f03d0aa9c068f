"""The benchmark's code path, once, on tiny CPU shapes (``--smoke``), so that it cannot rot.

No figure from this run means anything; the H200 figures come from
``bench.gate_residual`` on the GPU (docs/performance.md).
"""

from __future__ import annotations

import json

import pytest
import torch

from gate_residual_matrix.bench import gate_residual as bench
from gate_residual_matrix.bench import rounds as bench_rounds
from gate_residual_matrix.contract import timing


def test_bench_smoke_writes_rows_peers_host_costs_and_a_table(tmp_path, capsys):
    assert bench.main(["--smoke", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("bench-*-smoke.json")
    doc = json.loads(path.read_text())
    assert doc["device"] == "cpu" and doc["copy_GBps"] > 0
    assert (doc["iters"], doc["rounds"]) == (3, 3)  # --smoke: 3 calls, one per round
    rows = {(r["dtype"], r["N"], r["impl"]): r for r in doc["rows"]}
    for n in (1, 257):
        for impl in ("eager", "numba"):
            row = rows[("bfloat16", n, impl)]
            assert row["forward_ms"] > 0 and row["forward_backward_ms"] > 0, row
            assert row["forward_copy_fraction"] > 0 and row["D"] == 64 and row["G"] == 3
            for mode in ("forward", "forward_backward"):  # the spread of the pooled samples
                assert (row[f"{mode}_p25_ms"] <= row[f"{mode}_ms"]
                        <= row[f"{mode}_p75_ms"]), row
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
    assert "interleaved rounds: 3 per case" in table
    assert "wrote" in capsys.readouterr().out


def test_a_peer_that_raises_is_a_row_with_the_error():
    def broken(*_):
        raise RuntimeError("no kernel image\nsecond line")

    peer = bench.Peer("broken", "test", broken, broken)
    x = {k: torch.ones(2, 4) for k in ("residual", "y", "grad_out")}
    x.update(gate=torch.ones(1, 4), index=torch.zeros(2, dtype=torch.int64))
    row = bench.time_peer(peer, [x], "float32", 2, "cpu", iters=2, warmup=1)
    assert row == {"error": "RuntimeError: no kernel image"}


def test_bench_without_a_gpu_refuses_rather_than_writing_cpu_figures(tmp_path, capsys):
    """Exit 4 (cannot run here) with one line, not argparse's usage block and its 2."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert bench.main(["--out", str(tmp_path)]) == 4
    assert not list(tmp_path.iterdir())
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("error: no CUDA device: the benchmark needs a GPU (")


def _inputs(sets: int) -> list[dict]:
    """``sets`` tiny float32 input sets; set k's ``residual`` is all k (to tell them apart)."""
    out = []
    for k in range(sets):
        x = {key: torch.ones(2, 4) for key in ("y", "grad_out")}
        x.update(residual=torch.full((2, 4), float(k)), gate=torch.ones(1, 4),
                 index=torch.zeros(2, dtype=torch.int64))
        out.append(x)
    return out


def _recording_peer(name: str, log: list, *, backward_fails: bool = False) -> bench.Peer:
    """A peer whose calls append (name, "fwd" or "step", the input set's number) to ``log``."""
    def forward(r, g, y, i):
        log.append((name, "step" if torch.is_grad_enabled() else "fwd", int(r[0, 0])))
        if backward_fails and torch.is_grad_enabled():
            raise RuntimeError("no backward here")
        return r + g.index_select(0, i) * y

    return bench.Peer(name, "test", forward, forward)


def test_peers_are_timed_in_interleaved_rounds_with_the_order_rotated():
    log: list = []
    names = ("a", "b", "c")
    table = [_recording_peer(name, log) for name in names]
    rows = bench.time_peers(table, _inputs(4), "float32", 2, "cpu", iters=6, warmup=1,
                            rounds=3)
    turns = [name for k, (name, _, _) in enumerate(log) if k == 0 or log[k - 1][0] != name]
    # round r starts at peer r mod 3: not a, a, a, b, b, b, ... (one peer's stretch each)
    assert turns == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    # each turn: 1 warm-up + 2 timed forwards, then 1 + 2 forward+backward steps
    assert len(log) == 9 * 6
    for k in range(9):
        assert [mode for _, mode, _ in log[6 * k:6 * k + 6]] == ["fwd"] * 3 + ["step"] * 3
    # a peer's input sets go on rotating across its rounds, as in one long stretch
    for name in names:
        for mode in ("fwd", "step"):
            seen = [s for who, m, s in log if who == name and m == mode]
            assert seen == [k % 4 for k in range(9)], (name, mode, seen)
    for row in rows:
        assert set(row) == {f"{m}{s}" for m in ("forward", "forward_backward")
                            for s in ("_ms", "_p25_ms", "_p75_ms")}, row
        assert row["forward_p25_ms"] <= row["forward_ms"] <= row["forward_p75_ms"]


def test_a_peer_whose_backward_raises_keeps_its_forward_over_all_rounds():
    log: list = []
    table = [_recording_peer("ok", log), _recording_peer("half", log, backward_fails=True)]
    ok, half = bench.time_peers(table, _inputs(2), "float32", 2, "cpu", iters=4, warmup=0,
                                rounds=2)
    assert "forward_backward_ms" in ok and "error" not in ok
    assert half["error"] == "RuntimeError: no backward here" and half["forward_ms"] > 0
    assert "forward_backward_ms" not in half
    assert [m for who, m, _ in log if who == "half"] == ["fwd", "fwd", "step", "fwd", "fwd"]


def test_rounds_split_the_timed_calls_and_rotate_the_start():
    assert bench_rounds.split_iters(100, 5) == [20] * 5
    assert bench_rounds.split_iters(7, 3) == [3, 2, 2]
    with pytest.raises(ValueError, match="rounds"):
        bench_rounds.split_iters(3, 4)
    assert [bench_rounds.round_order(3, r) for r in range(4)] == [
        [0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]


def test_median_ms_returns_its_samples_only_when_asked_and_percentiles_interpolate():
    plain = timing.median_ms(lambda _i: None, device="cpu", warmup=0, iters=3)
    assert set(plain) == {"median_ms", "min_ms", "iters"}
    full = timing.median_ms(lambda _i: None, device="cpu", warmup=0, iters=3, samples=True)
    assert len(full["samples_ms"]) == full["iters"] == 3
    assert timing.percentile([4.0, 1.0, 3.0, 2.0], 25) == 1.75
    assert timing.percentile([1.0, 2.0, 3.0], 50) == 2.0 == timing.percentile([2.0], 75)
    with pytest.raises(ValueError):
        timing.percentile([], 50)


def test_bench_refuses_more_rounds_than_timed_calls(tmp_path):
    with pytest.raises(SystemExit) as info:
        bench.main(["--out", str(tmp_path), "--iters", "4", "--rounds", "5"])
    assert info.value.code == 2 and not list(tmp_path.iterdir())


def test_case_and_peer_restrict_the_run_and_unknown_ones_are_refused(tmp_path):
    """``--case`` / ``--peer`` (issue 14's repeated small-N runs): only those rows, and a
    peer not named is never made (RL-Kernel's builds its extension when made)."""
    assert bench.main(["--smoke", "--out", str(tmp_path), "--case", "bfloat16:1",
                       "--peer", "eager", "--peer", "numba"]) == 0
    doc = json.loads(next(tmp_path.glob("bench-*.json")).read_text())
    assert {(r["dtype"], r["N"], r["impl"]) for r in doc["rows"]} == {
        ("bfloat16", 1, "eager"), ("bfloat16", 1, "numba"),
        ("bfloat16", 1, "numba backward alone")}
    assert [peer["name"] for peer in doc["peers"]] == ["eager", "numba"]
    for bad in (["--case", "bf16:1"], ["--case", "float32:0"], ["--peer", "nope"],
                ["--case", "bfloat16:99999999999999999999"]):
        with pytest.raises(SystemExit) as stop:
            bench.main(["--smoke", "--out", str(tmp_path), *bad])
        assert stop.value.code == 2
