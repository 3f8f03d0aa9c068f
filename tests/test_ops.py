"""Ops as units: each op's spec agrees with its implementations, the generic
input builder keeps gate_residual's committed input bits, and a second op runs through the
same cell runner with its own tensor names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gate_residual_matrix import ops
from gate_residual_matrix.contract.inputs import build
from gate_residual_matrix.runner.cell import catalog as implementations
from gate_residual_matrix.runner.cell.run import run_cell
from gate_residual_matrix.runner.config.matrix import load_matrix, parse_matrix
from gate_residual_matrix.runner.plan.cells import Cell, expand, select_cases
from tests.committed_reports import HOST_PLAIN_CPU, committed_reports

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("op", ops.OPS)
def test_the_spec_lists_the_registered_implementations(op, monkeypatch):
    spec = ops.get(op)
    known = implementations.known(op)
    assert known[:len(spec.implementation_names)] == spec.implementation_names
    # every other registered row is a fault-injection row of the tests (ops/*/faulty.py)
    from gate_residual_matrix.ops.gate_residual import faulty

    injected = {v.name for v in vars(faulty).values() if hasattr(v, "has_backward")}
    assert set(known[len(spec.implementation_names):]) <= injected
    names = set(spec.implementation_names)
    assert {"eager", "numba", "fp64", "compiled", "compiled_emulate"} <= names
    numba = implementations.get("numba", op)
    assert numba.bitwise_claims == spec.bitwise  # our kernel claims what the spec says
    assert spec.forward == "out" and set(spec.grads) == {
        o.grad_of and k for k, o in spec.outputs.items() if o.grad_of}


def test_unknown_op_and_tensor_are_one_line_errors():
    with pytest.raises(KeyError, match="unknown op 'gate_norm'; choose from gate_residual, "):
        ops.get("gate_norm")
    with pytest.raises(KeyError, match="has no tensor 'gate'; choose from x, scale"):
        ops.get("indexed_scale_shift").shape("gate", n=1, sizes={"D": 1, "G": 1})


@pytest.mark.parametrize(("case", "dtype", "index_dtype"), [
    ("257", "bfloat16", "int64"), ("257-specials", "float16", "int32")])
def test_gate_residual_inputs_keep_the_committed_bits(case, dtype, index_dtype):
    """The spec-driven builder gives the input sha256 of a committed host-plain-cpu report."""
    report = json.loads(HOST_PLAIN_CPU.read_text())
    key = case if dtype == "bfloat16" else f"{case}-{dtype}-{index_dtype}"
    p = report["problem"]
    x = build(ops.get("gate_residual"), n=257, sizes={"D": p["D"], "G": p["G"]}, dtype=dtype,
              index_dtype=index_dtype, seed=p["seed"], specials=case.endswith("specials"),
              case_id=case)
    assert x.sha256() == report["inputs"][key]["sha256"]
    assert x.index_counts(p["G"]) == report["inputs"][key]["index_counts"]


def test_scale_shift_inputs_follow_the_spec():
    spec = ops.get("indexed_scale_shift")
    x = build(spec, n=7, sizes={"D": 5, "G": 3}, dtype="float16", index_dtype="int32", seed=3)
    assert {k: tuple(v.shape) for k, v in x.tensors.items()} == {
        "x": (7, 5), "scale": (3, 5), "shift": (3, 5), "grad_out": (7, 5), "index": (7,)}
    assert x.tensors["index"].dtype == torch.int32 and int(x.tensors["index"].max()) < 3
    again = build(spec, n=7, sizes={"D": 5, "G": 3}, dtype="float16", index_dtype="int32",
                  seed=3)
    assert x.sha256() == again.sha256()


def test_the_scale_shift_matrix_loads_with_its_own_cell_ids():
    m = load_matrix(ROOT / "matrix-scale-shift.yaml", known_implementations=implementations.known)
    assert m.op == "indexed_scale_shift" and m.problem.sizes == {"D": 5376, "G": 9}
    assert [c.id for c in expand(m)][:2] == ["scale_shift-host-plain-cuda",
                                            "scale_shift-host-plain-cpu"]
    assert set(m.implementations) == set(ops.get(m.op).implementation_names)


def test_a_problem_must_have_the_ops_sizes():
    data = {"schema_version": 1, "op": "indexed_scale_shift",
            "problem": {"D": 8, "H": 2, "dtype": "bfloat16", "index_dtype": "int64", "seed": 1},
            "cases": [{"n": 3}], "implementations": ["eager"], "baseline": "eager",
            "modes": {"plain": {}}, "stacks": {"host": {"kind": "host"}}, "targets": ["cpu"]}
    from gate_residual_matrix.runner.errors import ConfigError

    with pytest.raises(ConfigError, match=r"problem\.H: expected one of the keys D, G, dtype"):
        parse_matrix(data)


def test_scale_shift_cell_on_the_cpu():
    """numba's forward and grad_x have eager's bits, its parameter grads repeat, and the
    report names the op's tensors (x, scale, shift)."""
    data = {"schema_version": 1, "op": "indexed_scale_shift",
            "problem": {"D": 40, "G": 5, "dtype": "bfloat16", "index_dtype": "int64",
                        "seed": 7},
            "cases": [{"n": 37}, {"n": 33, "specials": True, "dtype": "float16",
                                  "index_dtype": "int32"}],
            "implementations": ["eager", "numba", "fp64"], "baseline": "eager",
            "accuracy_reference": "fp64", "repeats": 2, "timing": {"warmup": 0, "iters": 1},
            "batch_invariance": {"max_size": 33},
            "modes": {"plain": {}}, "stacks": {"host": {"kind": "host"}}, "targets": ["cpu"]}
    m = parse_matrix(data, known_implementations=implementations.known)
    r = run_cell(m, Cell("host", "plain", "cpu", "scale_shift-"), select_cases(m),
                 timings=False)
    assert r["status"] == "ok", r["reason"]
    assert r["op"] == "indexed_scale_shift" and r["problem"]["G"] == 5
    numba = r["results"]["numba"]
    for case in ("37", "33-specials-float16-int32"):
        cmp = numba["vs eager"][case]
        allowed = cmp["out"][0]["nan_payload_differ"]
        assert cmp["out"][0]["differ"] <= allowed
        assert set(cmp["grads"]) == {"x", "scale", "shift"}
        assert cmp["grads"]["x"]["differ"] <= cmp["grads"]["x"]["nan_payload_differ"]
        assert numba["repeatable"][case] == {"out": True, "x": True, "scale": True,
                                             "shift": True}
        assert numba["batch_invariant"][case]["size_sweep"] is True
        assert set(r["inputs"][case]["sha256"]) == {"x", "scale", "shift", "grad_out", "index"}
    assert r["inputs"]["37"]["n"] == sum(r["inputs"]["37"]["index_counts"])


def test_a_version_1_report_is_upgraded_with_the_first_ops_tensors():
    from gate_residual_matrix.runner.reports.store import SCHEMA_VERSION, upgrade

    v1 = {"schema_version": 1, "op": "gate_residual", "x": 1}
    v2 = upgrade(v1)
    assert SCHEMA_VERSION == 2 and v2["schema_version"] == 2 and v2["x"] == 1
    assert {k: t["label"] for k, t in v2["tensors"].items()} == {
        "out": "out", "res": "grad_res", "y": "grad_y", "gate": "grad_gate"}
    assert v2["index_groups"] == "G" and v1 == {"schema_version": 1, "op": "gate_residual",
                                                "x": 1}


def test_every_committed_report_loads(tmp_path):
    """Today's reports (version 1 and 2, ours and foreign) load and validate."""
    from gate_residual_matrix.runner.reports.store import read_reports

    loaded = read_reports(committed_reports(tmp_path / "reports"))
    ours = [r for r in loaded if r.origin == "ours"]
    assert ours and all(r.problem is None for r in ours), [r.problem for r in ours if r.problem]
    assert all(r.data["schema_version"] == 2 and r.data["tensors"] for r in ours)


def test_config_report_and_table_tests_run_without_torch():
    """The runner's config, report and table code (and their tests) import no torch or
    numba: they run where neither is installed."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None; sys.modules['numba'] = None; "
            "import pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', "
            "'tests/test_config.py', 'tests/test_report.py', 'tests/test_tables.py', "
            "'tests/test_tables_read.py', 'tests/test_status.py']))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
