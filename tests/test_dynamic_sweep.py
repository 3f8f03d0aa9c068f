"""The batch-invariance checks of the ``torch.compile`` rows run on one graph with N dynamic
(ops/torch_compile.py ``run_dynamic``); the cases and the timings on a static graph of the
case's size; the report says which graph each used."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from gate_residual_matrix.contract.base import Implementation
from gate_residual_matrix.ops.gate_residual import SPEC, compiled, eager
from gate_residual_matrix.ops.gate_residual.inputs import make_inputs
from gate_residual_matrix.ops.torch_compile import Compiled, missing_compiler
from gate_residual_matrix.runner.cell import batch_invariance, case, timing_pass
from gate_residual_matrix.runner.errors import ReportError
from gate_residual_matrix.runner.reports import store as report_io


def inputs(n: int, d: int = 8) -> dict:
    return make_inputs(n=n, d=d, g=3, dtype="bfloat16", index_dtype="int64", seed=5).tensors


def counting(static_rows: list, dynamic_rows: list) -> Implementation:
    """eager's computation, recording the rows of each call by which entry it came through."""
    def through(rows: list):
        def run(x, *, backward: bool):
            rows.append(x["index"].shape[0])
            return eager.EAGER.run(x, backward=backward)
        return run
    return dataclasses.replace(eager.EAGER, name="counted", compiles_per_shape=True,
                               run=through(static_rows), run_dynamic=through(dynamic_rows))


@pytest.mark.parametrize("given_full", [False, True])
def test_every_check_calls_run_dynamic_and_nothing_static(given_full):
    static, dynamic = [], []
    impl = counting(static, dynamic)
    x = inputs(40)
    full = eager.EAGER.run({k: v.clone() for k, v in x.items()}, backward=True) \
        if given_full else None
    got = batch_invariance.check(impl, x, SPEC, max_size=33, full=full)
    assert got["graphs"] == {"row_alone": "dynamic", "sub_batches": "dynamic",
                             "size_sweep": "dynamic"}
    assert static == []  # no static graph of any size: a given `full` is not used either
    assert dynamic[0] == 33  # the sweep's top builds the graph
    sizes = set(batch_invariance.sweep_sizes(33)) | batch_invariance.checked_row_counts(40)
    assert set(dynamic) == sizes | {40}  # the whole batch, the sweep, the other checks
    assert got["size_sweep"] and got["row_alone"] and got["sub_batches"]


def test_a_dynamic_graph_that_differs_at_one_size_fails_row_alone():
    """The checks compare the dynamic graph's runs with its own whole batch: a graph whose
    one-row result differs fails ``row_alone`` (and the sweep), not the static graph."""
    def run_dynamic(x, *, backward: bool):
        got = eager.EAGER.run(x, backward=backward)
        if x["index"].shape[0] == 1:
            got = {k: v.clone() for k, v in got.items()}
            got["out"].view(torch.int16)[..., 0] ^= 1  # one bit of row 0
        return got
    impl = dataclasses.replace(eager.EAGER, name="counted", compiles_per_shape=True,
                               run_dynamic=run_dynamic)
    got = batch_invariance.check(impl, inputs(40), SPEC, max_size=33)
    assert not got["row_alone"] and got["first_failing_size"] == 1
    assert got["sub_batches"] is False  # its first part is one row


def test_only_implementations_that_compile_per_shape_name_a_graph():
    assert "graphs" not in batch_invariance.check(eager.EAGER, inputs(9), SPEC, max_size=9)
    static_only = dataclasses.replace(eager.EAGER, compiles_per_shape=True)
    got = batch_invariance.check(static_only, inputs(9), SPEC, max_size=9)
    assert got["graphs"]["size_sweep"] == "static"
    assert compiled.COMPILED.run_dynamic is not None
    assert compiled.COMPILED_EMULATE.run_dynamic is not None


def test_timings_of_a_compiled_row_say_static():
    class Timing:
        warmup, iters = 0, 1

    class M:
        timing = Timing()

    static, dynamic = [], []
    got = timing_pass.timings(counting(static, dynamic), inputs(5), "cpu", M())
    assert got["graph"] == "static" and dynamic == [] and static
    assert "graph" not in timing_pass.timings(eager.EAGER, inputs(5), "cpu", M())


def test_the_schema_takes_graphs_and_refuses_other_names():
    report = copy.deepcopy(_committed_report())
    entry = report["results"]["compiled"]
    key = next(iter(entry["batch_invariant"]))
    entry["batch_invariant"][key]["graphs"] = {"row_alone": "static", "sub_batches": "static",
                                               "size_sweep": "dynamic"}
    timed = next(iter(entry["timings"]))
    entry["timings"][timed]["graph"] = "static"
    report_io.validate(report)
    entry["batch_invariant"][key]["graphs"]["size_sweep"] = "jit"
    with pytest.raises(ReportError, match="jit"):
        report_io.validate(report)
    entry["batch_invariant"][key]["graphs"]["size_sweep"] = "dynamic"
    entry["timings"][timed]["graph"] = 3
    with pytest.raises(ReportError, match="graph"):
        report_io.validate(report)


def _committed_report() -> dict:
    import json
    from pathlib import Path

    # a committed fixture with the compiled row's timings (never the working tree's reports/)
    path = Path(__file__).resolve().parent / "data" / "committed" / "host-plain-cuda.json"
    return json.loads(path.read_text())


def _fresh_compiled() -> Compiled:
    """Compiled rows of gate_residual over new code objects (no graphs from other tests)."""
    from gate_residual_matrix.ops.torch_compile import _own_code

    return Compiled("gate_residual", _own_code(compiled.expression),
                    _own_code(compiled.expression))


def _frames() -> int:
    from torch._dynamo.utils import counters

    return counters["frames"]["ok"]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_sweep_compiles_one_dynamic_graph_not_one_per_size(backend, monkeypatch):
    """A sweep over 1..9 and 12 rows compiles two frames through ``run_dynamic`` (N >= 2,
    and N = 1, which dynamo specialises), ten through static graphs (one per size). Under
    inductor the sweep's result may be false (its code differs between N = 1 and N >= 2):
    only the frames are counted there."""
    if backend == "inductor" and missing_compiler("cpu"):
        pytest.skip("needs a C++ compiler for inductor")
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, backend=backend, **kw))
    rows = _fresh_compiled()
    impl = dataclasses.replace(
        compiled.COMPILED,
        run=lambda x, *, backward: rows.run(x, backward=backward, emulate=False),
        run_dynamic=lambda x, *, backward: rows.run(x, backward=backward, emulate=False,
                                                    dynamic_rows=True))
    x = inputs(12)
    before = _frames()
    first = batch_invariance.size_sweep(impl, x, 12, SPEC)
    dynamic_frames = _frames() - before
    assert dynamic_frames == 2, dynamic_frames
    if backend == "inductor":
        return  # the static count below compiles ten graphs with a backward each: too slow
    assert first is None  # eager's kernels under aot_eager: batch-invariant
    before = _frames()
    static = dataclasses.replace(impl, run_dynamic=None)
    assert batch_invariance.size_sweep(static, x, 12, SPEC) is None
    assert _frames() - before == len(batch_invariance.sweep_sizes(12)) + 1 == 10  # and 12


def test_an_inference_cells_timings_run_under_inference_mode():
    """Its runs compiled their graph under ``torch.inference_mode()``: the timing loop calls
    that graph, not one of its own."""
    class Timing:
        warmup, iters = 0, 2

    class M:
        timing = Timing()

    seen = []

    def run(x, *, backward: bool):
        seen.append((torch.is_inference_mode_enabled(), backward))
        return eager.EAGER.run(x, backward=backward)

    impl = dataclasses.replace(eager.EAGER, name="counted", run=run)
    got = timing_pass.timings(impl, inputs(5), "cpu", M(), inference=True)
    assert "forward_backward_ms" not in got and seen and set(seen) == {(True, False)}
    seen.clear()
    timing_pass.timings(impl, inputs(5), "cpu", M())
    assert {s[0] for s in seen} == {False} and (False, True) in seen


class _TwoCalls:
    """A matrix stand-in whose timing loops make one warm-up call and two timed ones."""

    class timing:  # Matrix.timing's name
        warmup, iters = 1, 2


def _eager_as(name: str, note, fails, message: str) -> Implementation:
    """eager's computation named ``name``: each call first ``note(x, backward)``, then raises
    ``RuntimeError(message)`` where ``fails(x)``."""
    def run(x, *, backward: bool):
        note(x, backward)
        if fails(x):
            raise RuntimeError(message)
        return eager.EAGER.run(x, backward=backward)
    return dataclasses.replace(eager.EAGER, name=name, run=run)


def test_the_first_forward_call_is_made_before_the_gpu_is_taken(monkeypatch, tmp_path):
    """Where cells share the GPU, a timing loop's first call of its kind (a compiled row's
    forward graph without autograd) is made under the shared lock, before the exclusive one:
    the other cells do not wait for it. One that fails is recorded and not timed; the others
    are. Where nothing shares the GPU, no such call is made; when none is left to time, the
    GPU is not taken."""
    import contextlib

    from gate_residual_matrix.contract import gpu_lock
    from gate_residual_matrix.runner.cell.phases import PhaseClock

    held = []

    @contextlib.contextmanager
    def exclusive():
        held.append(True)
        try:
            yield
        finally:
            held.pop()

    monkeypatch.setattr(gpu_lock, "exclusive", exclusive)
    monkeypatch.setenv(gpu_lock.ENV, str(tmp_path / "gpu.lock"))
    taken = []
    real_exclusive = exclusive

    @contextlib.contextmanager
    def counted():
        taken.append(True)
        with real_exclusive():
            yield

    monkeypatch.setattr(gpu_lock, "exclusive", counted)
    calls = []

    def recording(name, fail=False):
        return _eager_as(name, lambda x, backward: calls.append((name, bool(held), backward)),
                         lambda x: fail, "no kernel for this")

    M = _TwoCalls
    good, bad = recording("good"), recording("bad", fail=True)
    results = {n: {"timings": {}, "status": "ok"} for n in ("good", "bad")}
    ctx = case.CaseContext(spec=SPEC, matrix=M(), target="cpu", device="cpu",
                           impls=[good, bad], results=results, clock=PhaseClock(sync=False),
                           hasher=None, inference=False, with_timings=True)

    class X:
        tensors = inputs(6)

    case._time_all(ctx, [good, bad], X(), X.tensors, "6")
    assert calls[0] == ("good", False, False) and calls[1] == ("bad", False, False)
    assert all(h for n, h, _ in calls[2:]) and {n for n, _, _ in calls[2:]} == {"good"}
    assert "6" in results["good"]["timings"] and results["bad"]["timings"] == {}
    assert "no kernel for this" in results["bad"]["reason"]
    assert len(taken) == 1
    # every first call fails: nothing to time, the GPU is not taken
    calls.clear()
    case._time_all(ctx, [bad], X(), X.tensors, "7")
    assert calls == [("bad", False, False)] and len(taken) == 1
    # no other process shares the GPU: only the timing loop's own calls, all inside
    monkeypatch.delenv(gpu_lock.ENV)
    calls.clear()
    case._time_all(ctx, [good], X(), X.tensors, "8")
    assert calls and all(h for _, h, _ in calls) and len(taken) == 2


def test_a_shared_gpu_times_every_case_in_one_pass_at_the_end(monkeypatch, tmp_path):
    """Where cells share the GPU (``ctx.deferred``), a case's timings wait: its device copies
    are not kept, and one exclusive section after the last case times every case, on inputs
    moved to the device again. A failing implementation is recorded for its case only."""
    import contextlib

    from gate_residual_matrix.contract import gpu_lock
    from gate_residual_matrix.runner.cell.phases import PhaseClock

    taken = []

    @contextlib.contextmanager
    def exclusive():
        taken.append(True)
        yield

    monkeypatch.setattr(gpu_lock, "exclusive", exclusive)
    monkeypatch.setenv(gpu_lock.ENV, str(tmp_path / "gpu.lock"))
    seen = []

    def recording(name, fail_on=None):
        return _eager_as(name, lambda x, backward: seen.append(
            (name, x["index"].shape[0], len(taken))),
            lambda x: x["index"].shape[0] == fail_on, "no kernel at this size")

    M = _TwoCalls
    good, flaky = recording("good"), recording("flaky", fail_on=7)
    results = {n: {"timings": {}, "status": "ok"} for n in ("good", "flaky")}
    ctx = case.CaseContext(spec=SPEC, matrix=M(), target="cpu", device="cpu",
                           impls=[good, flaky], results=results, clock=PhaseClock(sync=False),
                           hasher=None, inference=False, with_timings=True, deferred=[])
    xs = {}
    for n in (6, 7):
        class X:
            tensors = inputs(n)
        xs[n] = X()
        case._time_all(ctx, [good, flaky], xs[n], xs[n].tensors, str(n))
    assert seen == [] and taken == [] and results["good"]["timings"] == {}
    assert [p.on_device for p in ctx.deferred] == [None, None]
    case.time_pending(ctx, ctx.deferred)
    assert len(taken) == 1, (seen, results)
    assert set(results["good"]["timings"]) == {"6", "7"}
    assert set(results["flaky"]["timings"]) == {"6"} and "case 7" in results["flaky"]["reason"]
    first_calls = [s for s in seen if s[2] == 0]
    assert {(n, rows) for n, rows, _ in first_calls} == {("good", 6), ("good", 7), ("flaky", 6),
                                                         ("flaky", 7)}
    assert all(t == 1 for _, _, t in seen[len(first_calls):])
