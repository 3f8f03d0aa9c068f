"""The benchmark's whole path on the CPU (the hidden ``--rehearse``: tiny N, ``perf_counter``)
for every registered op, and its parts alone. No figure from these runs means anything; the
GPU's figures are docs/performance.md's."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from gate_residual_matrix import ops
from gate_residual_matrix.bench import cli, run
from gate_residual_matrix.bench import rounds as bench_rounds
from gate_residual_matrix.bench.cases import input_sets, set_count
from gate_residual_matrix.bench.peers import Peer, peer_of, skip_reason
from gate_residual_matrix.contract import timing
from gate_residual_matrix.contract.base import Implementation
from gate_residual_matrix.contract.inputs import build
from gate_residual_matrix.runner.cell import catalog

MODES = ("forward", "forward_backward")


@pytest.mark.parametrize("op", ops.OPS)
def test_rehearsal_times_every_op_against_the_copy_and_names_every_row(op, tmp_path, capsys):
    """Every row of the op's matrix is a peer or named once with its reason; the peers and
    the copy of the spec's bytes are timed; the ratios are within the case."""
    assert cli.main(["--rehearse", "--no-compile", "--skip", "numba", "--op", op,
                     "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{op}.json", f"{op}.md"]
    doc = json.loads((tmp_path / f"{op}.json").read_text())
    _, matrix = run.matrix_of(op)
    peers = [p["name"] for p in doc["peers"]]
    skipped = {k["name"]: k["reason"] for k in doc["skipped"]}
    assert sorted(peers + list(skipped)) == sorted(i.name for i in catalog.rows(matrix))
    assert not set(peers) & set(skipped) and matrix.baseline in peers
    assert "accuracy reference" in skipped[matrix.accuracy_reference]
    assert skipped["numba"] == "left out by --skip"
    assert "--no-compile" in skipped["compiled"]
    out = capsys.readouterr().out
    for name, reason in skipped.items():
        assert out.count(f"{op}: not timed: {name}: {reason}") == 1, name
    rows = {r["impl"]: r for r in doc["rows"]}
    assert set(rows) == {"copy", *peers} and {r["N"] for r in doc["rows"]} == {3}
    copy, base = rows["copy"], rows[matrix.baseline]
    assert (copy["forward_bytes"], copy["forward_backward_bytes"]) == ops.get(op).bytes_moved(
        3, matrix.problem.sizes, 2)
    for mode in MODES:
        assert base[f"{mode}_p25_ms"] <= base[f"{mode}_ms"] <= base[f"{mode}_p75_ms"]
        assert base[f"{mode}_vs_baseline"] == 1.0
        assert base[f"{mode}_copy_fraction"] == pytest.approx(copy[f"{mode}_ms"]
                                                              / base[f"{mode}_ms"])
        assert max(r.get(f"{mode}_vs_fastest", 0) for r in doc["rows"]) == 1.0
        assert f"{mode}_vs_fastest" not in copy
    assert (doc["op"], doc["device"], doc["complete"], doc["iters"], doc["rounds"]) == (
        op, "cpu", True, 3, 3)
    assert doc["copy_GBps"] > 0 and doc["problem"] == matrix.problem.as_report()
    assert doc["environment"]["torch"] == torch.__version__ and "commit" in doc
    table = (tmp_path / f"{op}.md").read_text()
    assert f"| bfloat16 | 3 | {matrix.baseline} |" in table and "| bfloat16 | 3 | copy |" in table
    assert "## Not timed" in table and f"- **{matrix.accuracy_reference}**: " in table


def test_rehearsal_times_our_kernel_at_the_sizes_asked(tmp_path):
    """``--peer`` keeps those rows (the rest named as left out), ``--n`` the sizes."""
    assert cli.main(["--rehearse", "--op", "gate_residual", "--peer", "eager", "--peer",
                     "numba", "--n", "2", "--n", "5", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "gate_residual.json").read_text())
    assert {(r["N"], r["impl"]) for r in doc["rows"]} == {
        (n, impl) for n in (2, 5) for impl in ("copy", "eager", "numba")}
    assert all(r["forward_backward_ms"] > 0 for r in doc["rows"])
    assert {k["reason"] for k in doc["skipped"]} == {"left out by --peer"}


def test_a_deadline_lists_the_cases_not_run(tmp_path):
    assert cli.main(["--rehearse", "--op", "rms_norm", "--peer", "eager", "--deadline", "0",
                     "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "rms_norm.json").read_text())
    assert (doc["rows"], doc["complete"]) == ([], False)
    assert doc["cases_not_run"] == ["bfloat16 N=3 (--deadline 0 s)"]
    assert "**Incomplete run**: cases not run: bfloat16 N=3" in (
        tmp_path / "rms_norm.md").read_text()


def test_the_inputs_are_the_matrix_cells_rotated_over_three_l2s():
    spec = ops.get("indexed_scale_shift")
    _, matrix = run.matrix_of("indexed_scale_shift")
    sets = input_sets(spec, matrix, 5, "float16", "cpu", l2=1 << 20)
    p = matrix.problem
    cell = build(spec, n=5, sizes=p.sizes, dtype="float16", index_dtype=p.index_dtype,
                 seed=p.seed, case_id="5").tensors  # runner/cell/run.py's case "5-float16"
    per_set = sum(t.numel() * t.element_size() for t in cell.values())
    assert len(sets) == set_count(per_set, 1 << 20) > 1
    for x in sets:
        assert x.keys() == cell.keys() and all(torch.equal(x[k], cell[k]) for k in cell)
    assert sets[0]["x"].data_ptr() != sets[1]["x"].data_ptr()
    assert set_count(352 << 20, 60 << 20) == 1 and set_count(1 << 20, 60 << 20) == 64


def _impl(name: str, run_fn, **kw) -> Implementation:
    return Implementation(name=name, source="test", has_backward=True, run=run_fn, **kw)


def test_a_peer_that_writes_its_inputs_gets_its_own_and_one_that_raises_is_an_error():
    def writes(x, *, backward):
        x["x"].add_(1)
        return {"out": x["x"]}

    def raises(x, *, backward):
        raise RuntimeError("no kernel image\nsecond line")

    sets = [{"x": torch.zeros(2, 3)}, {"x": torch.ones(2, 3)}]
    peer, error = run.probe(peer_of(_impl("w", writes)), sets)
    assert error is None and peer.mutates == ("x",) and len(peer.sets) == 2
    assert all(torch.equal(a["x"], b["x"]) and a["x"].data_ptr() != b["x"].data_ptr()
               for a, b in zip(peer.sets, sets, strict=True))
    assert torch.equal(sets[0]["x"], torch.zeros(2, 3))  # the probe wrote clones
    peer, error = run.probe(peer_of(_impl("r", raises)), sets)
    assert error == "RuntimeError: no kernel image"
    peer, error = run.probe(peer_of(_impl("e", lambda x, backward: {"out": x["x"] + 1})), sets)
    assert (error, peer.sets, peer.mutates) == (None, None, ())


def test_rows_that_are_no_peers_say_why():
    assert "accuracy reference" in skip_reason(
        _impl("fp64", lambda x, backward: {}, role="accuracy_reference"), "cpu")
    assert skip_reason(_impl("vllm_x-0.30.0", lambda x, backward: {}), "cpu",
                       skip=("vllm_x",)) == "left out by --skip"
    assert skip_reason(_impl("c", lambda x, backward: {}, compiles_per_shape=True), "cpu",
                       compile=False) == "compiles per shape: left out by --no-compile"
    assert skip_reason(_impl("g", lambda x, backward: {}, targets=("cuda",)), "cpu") == (
        "g does not run on target 'cpu'")
    from gate_residual_matrix.ops.gate_residual import faulty
    assert skip_reason(faulty.FAULT, "cpu") == "a test-only fault injector"
    assert skip_reason(_impl("ok", lambda x, backward: {}), "cpu") is None


def test_ratios_are_taken_within_each_case():
    rows = [{"dtype": "bfloat16", "N": n, "impl": impl, "forward_ms": ms,
             **({"forward_backward_ms": 2 * ms} if impl != "lib" else {})}
            for n, scale in ((1, 1.0), (9, 10.0))
            for impl, ms in (("copy", 1.0 * scale), ("eager", 4.0 * scale),
                             ("ours", 2.0 * scale), ("lib", 8.0 * scale))]
    run.ratios(rows, "eager")
    by = {(r["N"], r["impl"]): r for r in rows}
    for n in (1, 9):
        assert by[(n, "ours")]["forward_copy_fraction"] == 0.5
        assert by[(n, "ours")]["forward_vs_fastest"] == 1.0
        assert by[(n, "ours")]["forward_vs_baseline"] == 2.0
        assert by[(n, "lib")]["forward_vs_fastest"] == 0.25
        assert "forward_backward_ms" not in by[(n, "lib")]
        assert by[(n, "eager")]["forward_backward_vs_fastest"] == 0.5
        assert "forward_vs_fastest" not in by[(n, "copy")]
    assert run.copy_gbps([{**by[(9, "copy")], "forward_bytes": 10**9,
                           "forward_backward_bytes": 2 * 10**9}]) == pytest.approx(100.0)


def test_bench_without_a_gpu_refuses_rather_than_writing_cpu_figures(tmp_path, capsys):
    """Exit 4 (cannot run here) with one line, not argparse's usage block and its 2."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert cli.main(["--out", str(tmp_path)]) == 4
    assert not list(tmp_path.iterdir())
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("error: no CUDA device: the benchmark needs a GPU (")


@pytest.mark.parametrize("bad", [["--iters", "4", "--rounds", "5"], ["--op", "nope"],
                                 ["--peer", "nope"], ["--skip", "nope"], ["--n", "0"],
                                 ["--dtype", "bf16"], ["--warmup", "-1"]])
def test_bad_options_are_usage_errors_and_write_nothing(bad, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--rehearse", "--op", "rms_norm", "--out", str(tmp_path), *bad])
    assert stop.value.code == 2 and not list(tmp_path.iterdir())
    assert "usage:" in capsys.readouterr().err


def _inputs(sets: int) -> list[dict]:
    """``sets`` tiny input sets; set k's ``x`` is all k (to tell them apart)."""
    return [{"x": torch.full((2, 4), float(k))} for k in range(sets)]


def _recording_peer(name: str, log: list, *, backward_fails: bool = False) -> Peer:
    """A peer whose calls append (name, "fwd" or "step", the input set's number) to ``log``."""
    def forward(x):
        log.append((name, "fwd", int(x["x"][0, 0])))
        return x["x"] + 1

    def step(x):
        log.append((name, "step", int(x["x"][0, 0])))
        if backward_fails:
            raise RuntimeError("no backward here")
        return x["x"] * 2

    return Peer(name, "test", forward, step)


def test_peers_are_timed_in_interleaved_rounds_with_the_order_rotated():
    log: list = []
    names = ("a", "b", "c")
    table = [_recording_peer(name, log) for name in names]
    rows = bench_rounds.time_peers(table, _inputs(4), "cpu", iters=6, warmup=1, rounds=3)
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
        assert set(row) == {f"{m}{s}" for m in MODES for s in ("_ms", "_p25_ms", "_p75_ms")}
        assert row["forward_p25_ms"] <= row["forward_ms"] <= row["forward_p75_ms"]


def test_a_peer_with_sets_of_its_own_rotates_over_those():
    log: list = []
    own = dataclasses.replace(_recording_peer("own", log), sets=_inputs(6)[4:])
    bench_rounds.time_peer(own, _inputs(2), "cpu", iters=3, warmup=0)
    assert [s for _, m, s in log if m == "fwd"] == [4, 5, 4]


def test_a_peer_whose_backward_raises_keeps_its_forward_over_all_rounds():
    log: list = []
    table = [_recording_peer("ok", log), _recording_peer("half", log, backward_fails=True)]
    ok, half = bench_rounds.time_peers(table, _inputs(2), "cpu", iters=4, warmup=0, rounds=2)
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


def test_gate_residuals_host_breakdown_runs_emulated_on_the_cpu():
    from gate_residual_matrix.bench.host import host_overhead

    host = host_overhead("cpu", quick=True)
    assert "no-op C function" in host["how"]
    for key in ("forward", "forward.packed_launch", "backward", "backward.chunk_launch"):
        assert host["per_call_us"][key] > 0, key


def test_a_bench_files_picture_draws_the_floor_of_its_own_op():
    """The tables' picture of ``<op>.json`` takes the bytes formula of the file's ``op``
    (rms_norm has no ``G``: the first op's formula could not draw its floor)."""
    pytest.importorskip("matplotlib")
    from gate_residual_matrix.runner.tables.render.plots import _bench_figure

    doc = {"op": "rms_norm", "copy_GBps": 4000.0,
           "rows": [{"dtype": "bfloat16", "N": n, "D": 5376, "impl": "eager",
                     "forward_ms": 0.1 * n / 4096, "forward_backward_ms": 0.3 * n / 4096}
                    for n in (4096, 32768)]}
    fig = _bench_figure("rms_norm", doc)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert "bandwidth floor (4000 GB/s copy)" in labels
    floor = next(line for line in fig.axes[0].get_lines() if "floor" in line.get_label())
    assert list(floor.get_ydata()) == pytest.approx(
        [ops.get("rms_norm").bytes_moved(n, {"D": 5376}, 2)[0] / 4e9 for n in (4096, 32768)])


def test_compile_ahead_covers_the_compiling_rows_at_every_case():
    """The calls handed to the matrix cell's precompile workers: both modes of each case for
    a row that compiles per shape, one call per case for a row that caches its kernels."""
    import types

    from gate_residual_matrix.bench.precompile import calls

    _, matrix = run.matrix_of("rms_norm")
    settings = run.Settings(device="cuda", dtypes=("bfloat16", "float32"), ns=(8, 3),
                            iters=1, warmup=0, rounds=1)
    table = [peer_of(_impl("compiled", lambda x, backward: {}, compiles_per_shape=True)),
             peer_of(_impl("numba", lambda x, backward: {}, cached_kernels=("cuda",))),
             dataclasses.replace(peer_of(_impl("lib", lambda x, backward: {},
                                               compiles_per_shape=True)),
                                 dtypes=("float32",)),
             peer_of(_impl("eager", lambda x, backward: {}))]
    got = calls(types.SimpleNamespace(table=table, matrix=matrix, settings=settings))
    cases = [(d, n) for n in (8, 3) for d in ("bfloat16", "float32")]
    want = ([("compiled", d, n, g) for d, n in cases for g in ("train", "no_grad")]
            + [("numba", d, n, "train") for d, n in cases]
            + [("lib", "float32", n, g) for n in (8, 3) for g in ("train", "no_grad")])
    assert sorted((c["impl"], c["dtype"], c["rows"], c["grad"]) for c in got) == sorted(want)
    assert {c["index_dtype"] for c in got} == {matrix.problem.index_dtype}


def test_compile_ahead_runs_the_matrix_cells_workers(monkeypatch):
    """One worker of runner.cell.precompile makes the calls (here the eager row, standing in
    for a compiling one, on the CPU) and its record comes back per op."""
    import types

    from gate_residual_matrix.bench.precompile import precompile

    monkeypatch.setenv("GATE_RESIDUAL_PRECOMPILE", "1")
    _, matrix = run.matrix_of("rms_norm")
    stub = types.SimpleNamespace(
        op="rms_norm", matrix=matrix,
        settings=run.Settings(device="cpu", dtypes=("bfloat16",), ns=(2,), iters=1, warmup=0,
                              rounds=1),
        table=[peer_of(_impl("eager", lambda x, backward: {}, compiles_per_shape=True))])
    said: list[str] = []
    records = precompile([stub], say=lambda line, **_: said.append(line))
    assert records["rms_norm"]["calls"] == 2 and records["rms_norm"]["failed"] == []
    assert said[0] == "precompile: 2 calls in 1 workers" and said[1].startswith(
        "precompile rms_norm: 2 calls, 1 workers, ")


def test_a_failure_outside_the_peers_is_one_line_and_a_log(tmp_path, capsys, monkeypatch):
    """An op whose case fails (here: its inputs) is one line and exit 1, the traceback in
    ``<op>.error.log``; the other ops still run and write their files."""
    real = run.input_sets

    def broken(spec, *args, **kwargs):
        if spec.name == "rms_norm":
            raise MemoryError("no room")
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(run, "input_sets", broken)
    assert cli.main(["--rehearse", "--op", "rms_norm", "--op", "indexed_scale_shift",
                     "--peer", "eager", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = f"error: rms_norm bfloat16 N=3: MemoryError: no room (traceback: {tmp_path}"
    assert err.count(line) == 2  # as it happens, and again at the end
    assert "MemoryError: no room" in (tmp_path / "rms_norm.error.log").read_text()
    doc = json.loads((tmp_path / "rms_norm.json").read_text())
    assert (doc["complete"], doc["cases_not_run"]) == (False, ["bfloat16 N=3 (error)"])
    assert json.loads((tmp_path / "indexed_scale_shift.json").read_text())["complete"]
