"""The registry: every implementation's availability, its code path, the compiled pair and
the library implementations' ``unavailable`` path (their packages are absent here; their
wiring: tests/test_libraries.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from gate_residual_matrix import ops
from gate_residual_matrix.contract.base import Implementation
from gate_residual_matrix.contract.row_blocks import RowBlocks
from gate_residual_matrix.ops.gate_residual import compiled, eager, libraries
from gate_residual_matrix.runner.cell import catalog as implementations
from gate_residual_matrix.runner.cell.run import run_cell
from gate_residual_matrix.runner.config.matrix import parse_matrix
from gate_residual_matrix.runner.plan.cells import Cell, select_cases

FAULTS = Path(__file__).resolve().parent / "data" / "faults.yaml"

LIBRARY_NAMES = [impl.name for impl in libraries.LIBRARIES]


KNOWN_IMPLEMENTATIONS = ops.get("gate_residual").implementation_names


def small_matrix(impls, **extra):
    data = yaml.safe_load(FAULTS.read_text())
    data.update(implementations=impls, modes={"plain": {}}, **extra)
    return parse_matrix(data, known_implementations=implementations.known)


def test_every_registered_implementation_is_known_to_the_config():
    assert set(implementations.known("gate_residual")) >= set(KNOWN_IMPLEMENTATIONS)
    assert set(KNOWN_IMPLEMENTATIONS) >= {
        "compiled", "compiled_emulate", "sglang_indexed_gate_triton",
        "sglang_residual_gate_add_jit", "vllm_omni_gated_residual", "rl_kernel_h3"}
    assert set(implementations.known("gate_residual")) >= set(LIBRARY_NAMES)


def test_unavailable_reason_names_the_import_that_failed():
    impl = Implementation("x", "x", False, eager.run, requires=("json", "no_such_pkg_4.sub"))
    why = impl.unavailable_reason("cuda")
    assert why.startswith("import no_such_pkg_4.sub failed: ModuleNotFoundError")
    assert "no_such_pkg_4" in why and not impl.available("cuda")
    assert impl.unavailable_reason("tpu") == "x does not run on target 'tpu'"
    assert Implementation("y", "y", False, eager.run, requires=("json",)).available("cpu")


def test_not_wired_stays_unavailable_when_its_requirements_import():
    impl = Implementation("x", "x", False, eager.run, requires=("json",), not_wired="later")
    assert impl.unavailable_reason("cuda") == "later"


@pytest.mark.parametrize("name", LIBRARY_NAMES)
def test_library_absent_is_unavailable_with_the_import(name):
    impl = implementations.get(name)
    assert impl.has_backward is (name == "rl_kernel_h3") and impl.entries
    why = impl.unavailable_reason("cuda")
    assert why is not None and why.startswith("import ") and "failed" in why


def test_library_cells_go_on_and_record_the_reason_and_code_path():
    m = small_matrix(["eager", "fp64", *LIBRARY_NAMES])
    r = run_cell(m, Cell("host", "plain", "cpu"), select_cases(m), timings=False)
    assert r["status"] == "ok"
    for name in LIBRARY_NAMES:
        entry = r["results"][name]
        assert entry["status"] == "unavailable" and entry["reason"]
        assert entry["code_path"] == implementations.get(name).ran()
    assert r["results"]["eager"]["code_path"] == "gate_residual_matrix.ops.gate_residual.eager.run"
    assert libraries.SGLANG_RESIDUAL_GATE_ADD_JIT.ran() == (
        "sglang.kernels.kda_kernels.residual_gate_add_jit:residual_gate_add_cuda")


def test_a_baseline_that_cannot_run_on_the_target_makes_the_cell_an_error():
    """With nothing to compare against, the cell is not ok (it used to be, its tables
    saying only "No comparisons"): it says which baseline gave nothing, where, and why."""
    name = LIBRARY_NAMES[0]
    m = small_matrix(["eager", "numba", "fp64", name], baseline=name)
    r = run_cell(m, Cell("host", "plain", "cpu"), select_cases(m), timings=False)
    assert r["status"] == "error"
    assert r["reason"].startswith(f"baseline {name} gave no result in case(s) "
                                  f"{', '.join(r['inputs'])} (")
    assert r["results"][name]["reason"] in r["reason"]
    assert r["reason"].endswith("so nothing there was compared with it")
    assert r["results"]["eager"]["status"] == "ok" and "vs eager" not in r["results"]["numba"]


def test_compiled_emulate_runs_on_the_cpu_and_does_not_leak_its_setting():
    from gate_residual_matrix.ops.gate_residual.inputs import make_inputs

    before = torch._inductor.config.emulate_precision_casts
    x = make_inputs(n=5, d=64, g=3, dtype="bfloat16", index_dtype="int64", seed=7,
                    specials=False).tensors
    got = compiled.run_emulate(dict(x), backward=True)
    want = eager.run(dict(x), backward=True)
    assert set(got) == {"out", "res", "y", "gate"}
    assert torch.equal(got["out"].view(torch.int16), want["out"].view(torch.int16))
    assert torch._inductor.config.emulate_precision_casts == before


def test_compile_failure_is_an_error_and_the_cell_goes_on(monkeypatch):
    def broken(emulate, dynamic_rows=False):
        def fn(*args):
            raise RuntimeError("inductor: C++ compiler not found")
        return fn

    monkeypatch.setattr(compiled._COMPILE, "_fn", broken)  # the compiled function
    m = small_matrix(["eager", "fp64", "compiled"])
    r = run_cell(m, Cell("host", "plain", "cpu"), select_cases(m), timings=False)
    assert r["results"]["compiled"]["status"] == "error"
    assert "C++ compiler not found" in r["results"]["compiled"]["reason"]
    assert r["results"]["eager"]["status"] == "ok" and r["status"] == "error"


@pytest.mark.parametrize(("target", "tool", "env"), [("cpu", "g++", "CXX"), ("cuda", "cc", "CC")])
def test_compiled_is_unavailable_without_a_compiler(tmp_path, monkeypatch, target, tool, env):
    """An image without gcc/g++ cannot run torch.compile: the cell says so, not an error."""
    from gate_residual_matrix.ops.gate_residual import compiled

    monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    for impl in (compiled.COMPILED, compiled.COMPILED_EMULATE):
        reason = impl.unavailable_reason(target)
        assert reason and "none is on PATH" in reason and tool in reason, reason
    fake = tmp_path / tool
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    assert compiled.COMPILED.unavailable_reason(target) is None


def _autograd_fp64(x: dict) -> dict:
    """The float64 expression and autograd's backward, whole (ops/gate_residual/fp64.py's
    CPU reference, before it went by blocks of rows)."""
    residual, gate, y = (x[k].double().requires_grad_() for k in ("residual", "gate", "y"))
    out = residual + gate.index_select(0, x["index"]) * y
    out.backward(x["grad_out"].double())
    return {"out": out.detach(), "res": residual.grad, "y": y.grad, "gate": gate.grad}


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize(("n", "dtype"), [(3000, torch.bfloat16), (2049, torch.float16),
                                          (1025, torch.float32), (7, torch.bfloat16)])
def test_the_cpu_fp64_reference_by_blocks_has_the_bits_of_autograds_whole_graph(
        n, dtype, deterministic):
    """Blocks of rows, ``grad_gate`` summed block after block, NaN, ±Inf, -0.0 and
    subnormals planted: every output bit for bit as autograd's (the reference's bits are in
    the reports: a change would show as a new sha256 there)."""
    from gate_residual_matrix.ops.gate_residual import fp64

    gen = torch.Generator().manual_seed(n)
    d = 64
    x = {"residual": torch.randn(n, d, generator=gen).to(dtype),
         "y": (torch.randn(n, d, generator=gen) * 1e3).to(dtype),
         "grad_out": torch.randn(n, d, generator=gen).to(dtype),
         "gate": torch.randn(9, d, generator=gen).to(dtype),
         "index": torch.randint(0, 9, (n,), generator=gen)}
    for name, value in (("y", float("nan")), ("y", float("inf")), ("residual", -float("inf")),
                        ("grad_out", -0.0), ("residual", 1e-40), ("gate", 1e-42)):
        x[name].view(-1)[int(torch.randint(0, x[name].numel(), (1,), generator=gen))] = value
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        want = _autograd_fp64(x)
        got = fp64.run(x, backward=True)
        forward = fp64.run(x, backward=False)
    finally:
        torch.use_deterministic_algorithms(previous)
    assert list(got) == list(want)
    assert [type(v).__name__ for v in got.values()] == ["RowBlocks"] * 3 + ["Tensor"]
    got = {k: v.materialize() if isinstance(v, RowBlocks) else v for k, v in got.items()}
    for k in want:
        assert got[k].dtype == torch.float64
        assert torch.equal(got[k].view(torch.int64), want[k].view(torch.int64)), k
    assert torch.equal(forward["out"].materialize().view(torch.int64),
                       want["out"].view(torch.int64))
