"""The batch-invariance size sweep of the ``torch.compile`` rows runs on one graph with N
dynamic (ops/torch_compile.py ``run_dynamic``); the other checks, the cases and the timings
on a static graph per size; the report says which graph each used."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from gate_residual_matrix.contract.base import Implementation
from gate_residual_matrix.ops.gate_residual import SPEC, compiled, eager
from gate_residual_matrix.ops.gate_residual.inputs import make_inputs
from gate_residual_matrix.ops.torch_compile import Compiled, missing_compiler
from gate_residual_matrix.runner.cell import batch_invariance, case
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


def test_the_sweep_calls_run_dynamic_and_the_other_checks_run():
    static, dynamic = [], []
    got = batch_invariance.check(counting(static, dynamic), inputs(40), SPEC, max_size=33)
    assert got["graphs"] == {"row_alone": "static", "sub_batches": "static",
                             "size_sweep": "dynamic"}
    sweep = batch_invariance.sweep_sizes(33)
    assert sorted(set(dynamic)) == sweep  # the top (33) and every prefix, nothing static
    assert dynamic[0] == 33
    assert set(static) == batch_invariance.checked_row_counts(40) | {40}  # `full` + the checks
    assert got["size_sweep"] and got["row_alone"] and got["sub_batches"]


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
    got = case.timings(counting(static, dynamic), inputs(5), "cpu", M())
    assert got["graph"] == "static" and dynamic == [] and static
    assert "graph" not in case.timings(eager.EAGER, inputs(5), "cpu", M())


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
