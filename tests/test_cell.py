"""runner.cell.run: each case in its own dtypes, case targets, rows per gate index in the report."""

from __future__ import annotations

import random

import pytest
import torch

from gate_residual_matrix.ops.gate_residual.inputs import make_inputs
from gate_residual_matrix.runner.cell.run import case_key, fingerprint, run_cell, skeleton
from gate_residual_matrix.runner.config.matrix import parse_matrix
from gate_residual_matrix.runner.plan.cells import Cell
from gate_residual_matrix.runner.reports import store as report_io

TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def small_matrix(seed: int, cases: list[dict], **extra) -> object:
    """A tiny CPU matrix: D = 48, G = 5, eager/numba/fp64, one repeat, no timings."""
    return parse_matrix({
        "schema_version": 1, "op": "gate_residual",
        "problem": {"D": 48, "G": 5, "dtype": "bfloat16", "index_dtype": "int64", "seed": seed},
        "cases": cases, "implementations": ["eager", "numba", "fp64"], "baseline": "eager",
        "accuracy_reference": "fp64", "repeats": 2, "timing": {"warmup": 0, "iters": 1},
        "modes": {"plain": {}}, "stacks": {"host": {"kind": "host"}},
        "targets": ["cuda", "cpu"], **extra})


def test_each_case_runs_in_its_own_dtypes(fresh_seed: int) -> None:
    rng = random.Random(fresh_seed)
    n = rng.randrange(2, 300)
    cases = [{"n": n}, {"n": n, "dtype": "float16", "index_dtype": "int32"},
             {"n": n, "specials": True, "dtype": "float32"},
             {"n": n, "index_dtype": "int32", "targets": ["cuda"]}]
    m = small_matrix(fresh_seed, cases)
    report = run_cell(m, Cell("host", "plain", "cpu"), m.cases, timings=False)
    report_io.validate(report)
    assert report["status"] == "ok", report["reason"]
    # the cuda-only case is not run, nor listed, in the cpu cell
    assert report["cases"] == [n, f"{n}-float16-int32", f"{n}-specials-float32-int64"]
    assert set(report["inputs"]) == {str(c) for c in report["cases"]}
    for case in m.cases[:3]:
        dtype, index_dtype = m.case_dtypes(case)
        got = report["inputs"][str(case_key(case))]
        assert (got["dtype"], got["index_dtype"]) == (dtype, index_dtype)
        # the same values as the problem-dtype case of this N, rounded to this case's dtype
        x = make_inputs(n=n, d=48, g=5, dtype=dtype, index_dtype=index_dtype, seed=fresh_seed,
                        specials=case.specials, case_id=case.base_id)
        assert got["sha256"] == x.sha256()
        assert x.tensors["residual"].dtype == TORCH[dtype]
        index = x.tensors["index"]
        assert index.dtype == getattr(torch, index_dtype)
        assert got["index_counts"] == [int((index == g).sum()) for g in range(5)]
        assert sum(got["index_counts"]) == n and len(got["index_counts"]) == 5
        # grad_gate is compared and measured like any tensor, in this dtype
        assert report["results"]["numba"]["vs eager"][str(case_key(case))]["grads"]["gate"]
    plain = report["inputs"][str(n)]
    other = report["inputs"][f"{n}-float16-int32"]
    assert plain["index_counts"] == other["index_counts"]  # one index per N, any dtype
    assert plain["sha256"]["residual"] != other["sha256"]["residual"]


def test_a_cell_whose_cases_all_target_elsewhere_is_skipped() -> None:
    m = small_matrix(1, [{"n": 3, "targets": ["cuda"]}, {"n": 4, "targets": ["cuda"]}])
    report = run_cell(m, Cell("host", "plain", "cpu"), m.cases, timings=False)
    report_io.validate(report)
    assert report["status"] == "skipped" and report["cases"] == [] and report["inputs"] == {}
    assert report["reason"] == ("no selected case runs on target cpu (case targets: 3: cuda, "
                                "4: cuda)")


def test_skeleton_and_fingerprint_count_only_the_cases_of_the_target() -> None:
    cases = [{"n": 3}, {"n": 4, "targets": ["cuda"]}]
    m = small_matrix(1, cases)
    cpu, cuda = Cell("host", "plain", "cpu"), Cell("host", "plain", "cuda")
    frame = skeleton(m, cpu, m.cases, backend="host", run_id="x", status="skipped")
    assert frame["cases"] == [3]
    assert skeleton(m, cuda, m.cases, backend="host", run_id="x", status="skipped")[
        "cases"] == [3, 4]
    project = {"commit": None, "dirty": None}
    # a case that does not run on cpu does not make the cpu cell's fingerprint
    alone = small_matrix(1, [{"n": 3}, {"n": 4, "targets": ["cuda"]}])
    assert fingerprint(m, cpu, m.cases, project) == fingerprint(alone, cpu, alone.cases, project)
    assert fingerprint(m, cpu, m.cases, project) != fingerprint(m, cuda, m.cases, project)
    # the targets of a mode or case are not content: moving them keeps the fingerprint
    moved = small_matrix(1, [{"n": 3, "targets": ["cpu", "cuda"]},
                             {"n": 4, "targets": ["cuda"]}],
                         modes={"plain": {"targets": ["cpu", "cuda"]}})
    assert fingerprint(moved, cpu, moved.cases, project) == fingerprint(m, cpu, m.cases, project)


@pytest.mark.parametrize(("case", "key"), [
    ({"n": 257}, 257), ({"n": 257, "specials": True}, "257-specials"),
    ({"n": 257, "dtype": "float32"}, "257-float32-int64"),
    ({"n": 1, "specials": True, "index_dtype": "int32"}, "1-specials-bfloat16-int32"),
])
def test_case_key(case: dict, key: int | str) -> None:
    (c,) = small_matrix(1, [case]).cases
    assert case_key(c) == key


def test_an_implementation_that_does_not_take_a_dtype_is_not_run_on_it(monkeypatch) -> None:
    from gate_residual_matrix.runner.cell import catalog as implementations

    calls = []
    numba = implementations.get("numba")

    class OnlyBf16:
        """numba, declaring that it takes bfloat16 only (the optional ``dtypes`` field)."""

        def __init__(self) -> None:
            self.dtypes = ("bfloat16",)

        def __getattr__(self, name: str):
            return getattr(numba, name)

        def run(self, inputs, *, backward):
            calls.append(inputs["residual"].dtype)
            return numba.run(inputs, backward=backward)

    wrapped = OnlyBf16()
    real_get = implementations.get
    monkeypatch.setattr("gate_residual_matrix.runner.cell.catalog.get",
                        lambda name, op=None: wrapped if name == "numba" else real_get(name, op))
    m = small_matrix(2, [{"n": 5}, {"n": 5, "dtype": "float32"}])
    report = run_cell(m, Cell("host", "plain", "cpu"), m.cases, timings=False)
    report_io.validate(report)
    entry = report["results"]["numba"]
    assert entry["unsupported"] == {"5-float32-int64": "takes bfloat16 only, not float32"}
    assert set(entry["sha256"]) == {"5"} and set(entry["vs eager"]) == {"5"}
    assert set(calls) == {torch.bfloat16} and report["status"] == "ok"


@pytest.mark.parametrize("timing_targets", [None, ["cuda"]])
def test_timing_runs_only_on_the_timing_targets(fresh_seed: int, timing_targets) -> None:
    """``timing.targets`` leaving out cpu: the CPU cell records no timings (and all the rest)."""
    timing = {"warmup": 0, "iters": 1, **({"targets": timing_targets} if timing_targets else {})}
    m = small_matrix(fresh_seed, [{"n": 3}], timing=timing)
    report = run_cell(m, Cell("host", "plain", "cpu"), m.cases)
    assert report["status"] == "ok", report["reason"]
    assert all(entry["sha256"] for entry in report["results"].values())
    timed = {name for name, entry in report["results"].items() if entry["timings"]}
    assert timed == (set() if timing_targets else {"eager", "numba"}), timed  # fp64 never
