"""Compiling ahead in worker processes changes nothing the cell reports but its time."""

from __future__ import annotations

import random

import pytest

from gate_residual_matrix.ops.gate_residual.compiled import missing_compiler
from gate_residual_matrix.runner.cell import precompile
from gate_residual_matrix.runner.cell.batch_invariance import (
    checked_row_counts,
    row_counts,
    sweep_row_counts,
    sweep_sizes,
)
from gate_residual_matrix.runner.cell.catalog import get
from gate_residual_matrix.runner.cell.run import run_cell
from gate_residual_matrix.runner.config.matrix import parse_matrix
from gate_residual_matrix.runner.plan.cells import Cell
from gate_residual_matrix.runner.reports import store as report_io


def matrix(seed: int, n: int, **extra):
    return parse_matrix({
        "schema_version": 1, "op": "gate_residual",
        "problem": {"D": 16, "G": 3, "dtype": "bfloat16", "index_dtype": "int64", "seed": seed},
        "cases": [{"n": n}, {"n": n, "dtype": "float32", "index_dtype": "int32"}],
        "implementations": ["eager", "fp64", "compiled"], "baseline": "eager",
        "accuracy_reference": "fp64", "repeats": 2, "timing": {"warmup": 0, "iters": 1},
        "batch_invariance": {"max_size": 9},
        "modes": {"plain": {}, "inference": {"torch": {"inference_mode": True}}},
        "stacks": {"host": {"kind": "host"}}, "targets": ["cpu"], **extra})


def test_row_counts_are_every_size_the_checks_call():
    """The plan covers each row count batch_invariance.check calls, and nothing else."""
    for n, m in ((1, 1025), (257, 1025), (32768, 1025), (40, 9)):
        got = row_counts(n, m)
        assert set(sweep_sizes(min(n, m))) <= got and 1 in got and min(n, m) in got
        assert max(got) <= max(min(n, m), n // 2 + 1) and all(s > 0 for s in got)


def test_plan_lists_each_graph_once_in_case_order(fresh_seed):
    m = matrix(fresh_seed, 12)
    impls = [get("compiled"), get("compiled_emulate")]
    items = precompile.plan(m, m.cases, impls, target="cpu", inference=False)
    keys = [tuple(i.values()) for i in items]
    assert len(keys) == len(set(keys))
    assert items[0]["dtype"] == "bfloat16" and items[-1]["dtype"] == "float32"
    train = {i["rows"] for i in items if i["grad"] == "train" and i["dtype"] == "bfloat16"
             and "graph" not in i}
    assert train == {12}  # the case's size only: the checks' sizes are not static
    # the checks' one graph with N dynamic: built at its first call (the sweep's top, 9
    # rows), and N = 1, which dynamo specialises; nothing else
    dynamic = [(i["impl"], i["rows"]) for i in items
               if i.get("graph") == "dynamic" and i["dtype"] == "bfloat16"]
    assert dynamic == [("compiled", 9), ("compiled", 1), ("compiled_emulate", 9),
                       ("compiled_emulate", 1)]
    assert row_counts(12, 9) == checked_row_counts(12) | set(sweep_row_counts(12, 9))
    assert {i["rows"] for i in items if i["grad"] == "no_grad"} == {12}
    forward = precompile.plan(m, m.cases, impls, target="cpu", inference=True)
    assert {i["grad"] for i in forward} == {"inference"}  # its timings: the same graph


def test_the_dynamic_graph_of_two_rows_or_more_is_planned_when_the_sweep_stays_at_one(
        fresh_seed):
    """With ``max_size: 1`` the sweep calls one row only, but the whole batch and the
    sub-batches go through the N >= 2 dynamic graph: the plan lists it at the case's N."""
    m = matrix(fresh_seed, 12, batch_invariance={"max_size": 1})
    items = precompile.plan(m, m.cases[:1], [get("compiled")], target="cpu", inference=False)
    dynamic = [i["rows"] for i in items if i.get("graph") == "dynamic"]
    assert dynamic == [1, 12]


def test_kernels_cached_per_dtype_pair_are_run_once_per_case_size(fresh_seed):
    """numba's kernels go to the cubin cache once per dtype pair and kind of launch: one
    training call per case (no batch-invariance sizes), on the targets it caches on only."""
    from gate_residual_matrix.runner.plan.cells import cases_on

    m = matrix(fresh_seed, 12)
    numba = get("numba")
    assert numba.cached_kernels == ("cuda",) and not numba.compiles_per_shape
    items = precompile.plan(m, m.cases, [numba, get("compiled")], target="cuda",
                            inference=False)
    ours = [(i["dtype"], i["index_dtype"], i["rows"], i["grad"]) for i in items
            if i["impl"] == "numba"]
    assert ours == [("bfloat16", "int64", 12, "train"), ("float32", "int32", 12, "train")]
    forward = precompile.plan(m, m.cases, [numba], target="cuda", inference=True)
    assert {i["grad"] for i in forward} == {"inference"}
    with_numba = matrix(fresh_seed, 12, implementations=["eager", "fp64", "numba"])
    on_cpu = precompile.cell_plan(with_numba, Cell("host", "plain", "cpu"),
                                  cases_on(with_numba.cases, "cpu"))
    assert on_cpu == []  # numba's CPU twin keeps no kernel cache: nothing to run ahead


def test_workers_keep_two_cpus_and_can_be_set(monkeypatch):
    items = [{}] * 50
    monkeypatch.delenv("GATE_RESIDUAL_PRECOMPILE", raising=False)
    # a 2-CPU machine compiles in 2 workers: the cell waits for them, so none is kept idle
    assert precompile.workers_for(items, 2) == 2 and precompile.workers_for(items, 16) == 12
    assert precompile.workers_for(items, 1) == 0 and precompile.workers_for(items, 4) == 2
    assert precompile.workers_for(items[:3], 16) == 3
    monkeypatch.setenv("GATE_RESIDUAL_PRECOMPILE", "0")
    assert precompile.workers_for(items, 64) == 0
    monkeypatch.setenv("GATE_RESIDUAL_PRECOMPILE", "2")
    assert precompile.workers_for(items, 1) == 2


@pytest.mark.skipif(missing_compiler("cpu") is not None, reason="needs g++ for inductor")
def test_a_precompiled_cell_has_the_bits_of_one_that_compiles_itself(fresh_seed, monkeypatch,
                                                                      tmp_path):
    """Workers fill the same inductor cache; the cell's compiled outputs keep their bits."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    n = random.Random(fresh_seed).randrange(10, 40)
    m = matrix(fresh_seed, n)
    monkeypatch.setenv("GATE_RESIDUAL_PRECOMPILE", "2")
    warmed = run_cell(m, Cell("host", "plain", "cpu"), m.cases, timings=False)
    monkeypatch.setenv("GATE_RESIDUAL_PRECOMPILE", "0")
    alone = run_cell(m, Cell("host", "plain", "cpu"), m.cases, timings=False)
    for report in (warmed, alone):
        report_io.validate(report)
        assert report["status"] == "ok", report["reason"]
    record = warmed["environment"]["precompile"]
    assert record["workers"] == 2 and record["failed"] == []
    assert record["calls"] == len(precompile.cell_plan(m, Cell("host", "plain", "cpu"),
                                                       m.cases)) > 4
    assert "precompile" not in alone["environment"]
    assert warmed["phases"]["precompile"] > 0 and alone["phases"]["precompile"] == 0
    assert warmed["results"]["eager"]["sha256"] == alone["results"]["eager"]["sha256"]
    # compiled's CPU grad_gate may differ run to run (README: not repeatable in plain mode),
    # so its other tensors carry the claim
    for case, hashes in warmed["results"]["compiled"]["sha256"].items():
        other = alone["results"]["compiled"]["sha256"][case]
        assert {k: hashes[k] for k in ("out", "res", "y")} == {
            k: other[k] for k in ("out", "res", "y")}, case


def test_the_stamp_key_follows_what_decides_the_graphs(fresh_seed):
    """Another torch setting, mode variable, D, target or implementation gives another stamp;
    the calls are checked against the stamp's list (a subset is stamped, a superset not)."""
    m = matrix(fresh_seed, 12)
    items = precompile.plan(m, m.cases, [get("compiled")], target="cpu", inference=False)
    base = dict(torch_settings={"deterministic": None}, mode_env={}, op="gate_residual",
                sizes={"D": 16, "G": 3}, target="cpu")
    key = precompile.stamp_key(items, **base)
    assert key == precompile.stamp_key(items[1:], **base)
    emulate = precompile.plan(m, m.cases, [get("compiled_emulate")], target="cpu",
                              inference=False)
    assert len({key,
                precompile.stamp_key(emulate, **base),
                precompile.stamp_key(items, **{**base, "torch_settings": {"deterministic": True}}),
                precompile.stamp_key(items, **{**base, "mode_env": {"TRITON_F32_DEFAULT": "ieee"}}),
                precompile.stamp_key(items, **{**base, "sizes": {"D": 17, "G": 3}}),
                precompile.stamp_key(items, **{**base, "target": "cuda"})}) == 6


def test_a_stamp_covers_the_calls_it_lists_and_no_failed_run(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    calls = [{"impl": "compiled", "dtype": "bfloat16", "index_dtype": "int64", "rows": r,
              "grad": "train"} for r in (1, 2, 3)]
    precompile.leave_stamp("a" * 64, calls, {"failed": ["worker 0: exit code 1: boom"]})
    assert not precompile.stamped("a" * 64, calls)
    precompile.leave_stamp("b" * 64, calls[:2], {"failed": [], "workers": 2})
    assert precompile.stamped("b" * 64, calls[:2]) and precompile.stamped("b" * 64, calls[1:2])
    assert not precompile.stamped("b" * 64, calls) and not precompile.stamped("c" * 64, calls)
    precompile.leave_stamp("b" * 64, calls[2:], {"failed": []})  # added to what was there
    assert precompile.stamped("b" * 64, calls)
    precompile.stamp_path("d" * 64).parent.mkdir(parents=True, exist_ok=True)
    precompile.stamp_path("d" * 64).write_text("{not json")
    assert not precompile.stamped("d" * 64, calls)


@pytest.mark.skipif(missing_compiler("cpu") is not None, reason="needs g++ for inductor")
def test_one_pool_fills_every_mode_and_cells_then_skip_their_workers(fresh_seed, monkeypatch,
                                                                     tmp_path):
    """`python -m gate_residual_matrix.runner.cell.precompile --mode ...` compiles both modes'
    graphs in one pool; the cells then find their stamps, start no workers and keep the bits
    of a cell that compiled everything itself."""
    import yaml

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    n = random.Random(fresh_seed).randrange(10, 30)
    m = matrix(fresh_seed, n)
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(m.model_dump(mode="json", exclude_none=True)))
    outcome = precompile.precompile_modes(path, target="cpu", modes=["plain", "inference"],
                                          workers=2)
    assert outcome["plain"] == "compiled" and outcome["inference"] == "compiled", outcome
    again = precompile.precompile_modes(path, target="cpu", modes=["plain", "inference"])
    assert again == {"plain": "stamped", "inference": "stamped"}  # no "seconds": nothing ran
    monkeypatch.setenv("GATE_RESIDUAL_PRECOMPILE", "2")
    import torch._inductor.config as inductor_config

    with inductor_config.patch(compile_threads=2):  # inductor's own patch restores it
        loaded = run_cell(m, Cell("host", "plain", "cpu"), m.cases, timings=False)
        assert inductor_config.compile_threads == 1  # load only: no pool of compile processes
    assert loaded["environment"]["precompile"]["workers"] == 0
    assert loaded["environment"]["precompile"]["stamp"]
    assert loaded["phases"]["precompile"] == 0
    monkeypatch.setenv("GATE_RESIDUAL_PRECOMPILE", "0")
    alone = run_cell(m, Cell("host", "plain", "cpu"), m.cases, timings=False)
    for report in (loaded, alone):
        report_io.validate(report)
        assert report["status"] == "ok", report["reason"]
    assert loaded["results"]["eager"]["sha256"] == alone["results"]["eager"]["sha256"]
    for case, hashes in loaded["results"]["compiled"]["sha256"].items():
        other = alone["results"]["compiled"]["sha256"][case]
        assert {k: hashes[k] for k in ("out", "res", "y")} == {
            k: other[k] for k in ("out", "res", "y")}, case


def test_the_precompile_command_names_an_unknown_mode_in_one_line(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m",
                           "gate_residual_matrix.runner.cell.precompile", "--mode",
                           "nosuchmode",
                           "--target", "cpu"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "nosuchmode" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(("args", "says"), [
    (["--mode", "plain", "--target", "gpu"], "unknown target 'gpu'"),
    (["--mode", "plain", "--target", "cpu", "--workers", "-3"], "--workers"),
    (["--mode", "plain", "--target", "cpu", "--workers", "many"], "--workers"),
    ([], "--mode"),
    (["--mode", "plain", "--matrix", "/nonexistent/matrix.yaml"], "/nonexistent/matrix.yaml"),
    (["--mode", "plain", "--target", "cpu", "/tmp/stray.json"], "unrecognized arguments"),
])
def test_the_precompile_command_refuses_bad_input_in_one_line(args, says):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m",
                           "gate_residual_matrix.runner.cell.precompile", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr


def test_a_mode_without_a_cell_on_the_target_compiles_nothing(tmp_path, fresh_seed):
    """matrix.yaml's tf32 runs on cuda only: on cpu it is named, not compiled."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    outcome = precompile.precompile_modes(root / "matrix.yaml", target="cpu", modes=["tf32"])
    assert outcome == {"tf32": "not on target cpu"}


def test_target_cuda_without_a_gpu_is_one_line_exit_4():
    import subprocess
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    proc = subprocess.run([sys.executable, "-m",
                           "gate_residual_matrix.runner.cell.precompile", "--mode",
                           "plain"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4 and "needs a GPU" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_sigterm_stops_the_workers_with_the_command(tmp_path, fresh_seed):
    """SIGTERM while the workers compile: one line, exit 130, and no worker left running."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    m = matrix(fresh_seed, 300)
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(m.model_dump(mode="json", exclude_none=True)))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    proc = subprocess.Popen([sys.executable, "-m", "gate_residual_matrix.runner.cell.precompile",
                             "--matrix", str(path),
                             "--target", "cpu", "--mode", "plain", "--workers", "2"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    workers: list[int] = []
    while time.time() < deadline and len(workers) < 2:
        out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
        workers = [int(p) for p in out.stdout.split()]
        time.sleep(0.2)
    assert len(workers) == 2, "the workers did not start"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    time.sleep(0.5)
    for pid in workers:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_dynamo_guard_latency_profile_is_skipped_and_the_bits_stay(fresh_seed):
    """ops.torch_compile.skip_guard_latency_profile replaces the logged one-off guard timing
    that dynamo runs for every new graph; a compiled call still gives eager's bits."""
    import torch
    import torch._dynamo.guards as guards

    from gate_residual_matrix.ops import torch_compile

    torch_compile.skip_guard_latency_profile()
    assert guards.profile_guard_manager is torch_compile._no_guard_profile
    calls = []
    real = torch_compile._no_guard_profile
    try:
        guards.profile_guard_manager = lambda *a, **k: calls.append(a) or 0.0
        fn = torch.compile(lambda a, b: a + b * 3, dynamic=False)
        gen = torch.Generator().manual_seed(fresh_seed)
        x = torch.randn(11, generator=gen)
        assert torch.equal(fn(x, x), x + x * 3)
        assert calls  # dynamo does call it: the replacement is what runs
    finally:
        guards.profile_guard_manager = real
