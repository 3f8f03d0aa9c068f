"""Batch-invariance checks (runner/cell/batch_invariance.py), mutation detection and forward-only
implementations in a cell (runner/cell/run.py), with test-only implementations built to fail."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gate_residual_matrix.contract.base import Implementation
from gate_residual_matrix.ops.gate_residual import SPEC, eager, faulty, numba_kernel
from gate_residual_matrix.ops.gate_residual.inputs import make_inputs
from gate_residual_matrix.runner.cell import batch_invariance
from gate_residual_matrix.runner.cell import catalog as implementations
from gate_residual_matrix.runner.cell.run import run_cell
from gate_residual_matrix.runner.config.matrix import parse_matrix
from gate_residual_matrix.runner.plan.cells import Cell, select_cases

FAULTS = Path(__file__).resolve().parent / "data" / "faults.yaml"


@pytest.fixture
def test_only(monkeypatch):
    """The test-only implementations registered, as GATE_RESIDUAL_FAULTS=1 does."""
    for impl in faulty.TEST_ONLY:
        monkeypatch.setitem(implementations.registry("gate_residual"), impl.name, impl)


def matrix(impls, **extra):
    data = yaml.safe_load(FAULTS.read_text())
    data.update(implementations=impls, modes={"plain": {}, "inference": {
        "torch": {"inference_mode": True}}}, **extra)
    return parse_matrix(data, known_implementations=implementations.known)


def inputs(n, specials=False):
    return make_inputs(n=n, d=64, g=3, dtype="bfloat16", index_dtype="int64", seed=11,
                       specials=specials).tensors


def test_sweep_sizes():
    assert batch_invariance.sweep_sizes(1) == [1]
    assert batch_invariance.sweep_sizes(17) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 17]
    assert batch_invariance.sweep_sizes(1025)[-4:] == [511, 513, 1023, 1025]


@pytest.mark.parametrize("impl", [eager.EAGER, numba_kernel.NUMBA], ids=lambda i: i.name)
def test_eager_and_numba_are_batch_invariant_on_the_cpu(impl):
    got = batch_invariance.check(impl, inputs(40), SPEC, max_size=40)
    assert got == {"row_alone": True, "sub_batches": True, "size_sweep": True,
                   "first_failing_size": None, "max_size": 40}


def test_an_n_dependent_grad_gate_order_fails_the_size_sweep():
    got = batch_invariance.check(faulty.BATCH_VARIANT, inputs(40), SPEC, max_size=40)
    assert got["size_sweep"] is False and got["first_failing_size"] in range(2, 10)
    assert got["row_alone"] and got["sub_batches"]  # out and row grads are eager's


def test_a_row_depending_on_its_batch_fails_row_alone_and_sub_batches():
    def run(x, *, backward):
        got = eager.run(x, backward=backward)
        got["out"] = got["out"] * (1.0 if x["residual"].shape[0] == 40 else 2.0)
        return got

    impl = Implementation("n_scaled", "test", True, run)
    got = batch_invariance.check(impl, inputs(40), SPEC, max_size=40)
    assert got["row_alone"] is False and got["sub_batches"] is False
    assert got["size_sweep"] is False and got["first_failing_size"] == 1


def test_cell_records_batch_invariance_mutation_and_absent_grads(test_only):
    m = matrix(["eager", "fp64", "inplace", "batch_variant"],
               cases=[{"n": 5}, {"n": 17}], batch_invariance={"max_size": 17})
    r = run_cell(m, Cell("host", "plain", "cpu"), select_cases(m), timings=False)
    res = r["results"]
    assert res["batch_variant"]["batch_invariant"]["17"]["size_sweep"] is False
    assert res["eager"]["batch_invariant"]["17"]["size_sweep"] is True
    assert "batch_invariant" not in res["inplace"] and "batch_invariant" not in res["fp64"]
    assert res["inplace"]["mutated_inputs"] == {"5": ["residual"], "17": ["residual"]}
    assert res["inplace"]["reason"] == "mutates its inputs: case 5: residual; case 17: residual"
    assert res["eager"]["mutated_inputs"] == {"5": [], "17": []}
    # forward only: grads absent, not zero, and the comparisons hold only `out`
    assert set(res["inplace"]["sha256"]["5"]) == {"out"}
    assert "grads" not in res["inplace"]["vs eager"]["5"]
    assert res["inplace"]["vs eager"]["5"]["out"][0]["equal"] is True  # on its clone


def test_inference_mode_runs_forward_only(test_only):
    m = matrix(["eager", "fp64", "batch_variant"], batch_invariance={"max_size": 5})
    r = run_cell(m, Cell("host", "inference", "cpu"), select_cases(m), timings=False)
    for entry in r["results"].values():
        assert set(entry["sha256"]["5"]) == {"out"} and "batch_invariant" not in entry
    assert r["environment"]["mode_environment"] == {"inference": {}}
    # what the timings table needs to flag times taken on shared cores
    env = r["environment"]
    assert env["cpu_threads"] >= 1 and env["cpus_available"] >= 1
    assert all(isinstance(env["load_average"][k], float) for k in ("start", "end"))


def test_the_padded_comparison_needs_finite_inputs_without_rows():
    """Zeroed rows add exact zeros only while the weights are finite: with an Inf in
    ``weight`` a zeroed row adds ``0 * Inf`` = NaN to grad_scale, so the comparison is not
    made (the prefix rows still are); a fixed-order kernel passes either way."""
    from gate_residual_matrix import ops
    from gate_residual_matrix.contract.inputs import build
    from gate_residual_matrix.ops.rms_norm_scale_shift.numba_kernel import NUMBA
    from gate_residual_matrix.runner.cell import batch_invariance

    spec = ops.get("rms_norm_scale_shift")
    x = build(spec, n=20, sizes={"D": 16, "G": 3}, dtype="float32", index_dtype="int64",
              seed=5).tensors
    assert batch_invariance.padding_is_exact(x, spec)
    x["weight"][3] = float("inf")
    assert not batch_invariance.padding_is_exact(x, spec)
    x["x"][4, 2] = float("nan")  # a row input's special is zeroed with its row: still not exact
    assert batch_invariance.size_sweep(NUMBA, x, 20, spec) is None


def _breaks_at(sizes: set[int]) -> Implementation:
    """eager, with ``out`` doubled at the batch sizes in ``sizes``."""
    def run(x, *, backward):
        got = eager.run(x, backward=backward)
        if x["residual"].shape[0] in sizes:
            got["out"] = got["out"] * 2.0
        return got

    return Implementation(f"breaks_at_{min(sizes)}", "test", True, run)


@pytest.mark.parametrize("sizes", [{1}, {8}, {9}, {17, 33}, {33}, {8, 9}],
                         ids=lambda s: "-".join(map(str, sorted(s))))
def test_the_first_failing_size_is_the_smallest_that_fails(sizes):
    got = batch_invariance.size_sweep(_breaks_at(sizes), inputs(40), 40, SPEC)
    assert got == min(sizes)
