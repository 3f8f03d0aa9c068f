"""Library implementations: the unavailable path, and the wiring against TEST-ONLY FAKE packages.

The fakes below are written into a temporary directory put first on ``sys.path`` for one
test. Each mimics one library module at its real import path with the real function's
signature (copied from the wheels read: sglang 0.5.21/0.5.23, vllm-omni 0.28.0/0.30.0,
RL-Kernel at a26b41a3), computes with torch on the CPU and records its arguments. They check
that our implementation imports that exact path, converts our arguments to the library's
convention, records the code path and version, and that the cell runner (the real
``run_cell``, with the implementation allowed on the ``cpu`` target) sees grads absent for
forward-only ops and an in-place write into an input as a mutation.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import textwrap

import pytest
import torch
import yaml

from gate_residual_matrix.contract import compare, library
from gate_residual_matrix.ops.gate_residual import (
    libraries,
    rl_kernel_ops,
    sglang_ops,
    vllm_omni_ops,
)
from gate_residual_matrix.ops.gate_residual.eager import run as eager_run
from gate_residual_matrix.ops.gate_residual.inputs import make_inputs
from gate_residual_matrix.runner.cell import catalog as implementations
from gate_residual_matrix.runner.cell.run import run_cell
from gate_residual_matrix.runner.config.matrix import parse_matrix
from gate_residual_matrix.runner.plan.cells import Cell, select_cases

FAKE_ROOTS = ("sglang", "vllm_omni", "rl_engine")
LIBRARY_NAMES = [impl.name for impl in libraries.LIBRARIES]

FAKE_NOTE = '"""TEST-ONLY FAKE (tests/test_libraries.py): not the library; torch on the CPU."""\n'

SGL_TRITON = FAKE_NOTE + textwrap.dedent("""
    import torch
    CALLS = []

    def _indexed_gate_bf16(output, x, gate, other, indices):
        CALLS.append({"x": x, "gate": gate, "other": other, "indices": indices,
                      "in_place": output is x})
        gated = (gate.index_select(0, indices).float() * other.float()).to(torch.bfloat16)
        output.copy_((x.float() + gated.float()).to(output.dtype))
        return output

    def indexed_gate_bf16_(x, gate, other, indices):
        return _indexed_gate_bf16(x, x, gate, other, indices)

    def indexed_gate_bf16(x, gate, other, indices):
        return _indexed_gate_bf16(torch.empty_like(x), x, gate, other, indices)
    """)

# residual_gate_add_jit, in the layouts of sglang 0.5.23 (JIT CUDA backend) and 0.5.21
# (Triton backend, the JIT function defined but unused); DISPATCH picks what the custom op runs.
SGL_RGA = FAKE_NOTE + textwrap.dedent("""
    import torch
    CALLS = []

    def _compute(residual, update, gate):
        CALLS.append({"residual": residual, "update": update, "gate": gate})
        return (residual.float() + (update * gate).float()).to(residual.dtype)

    def _residual_gate_add_cuda_impl(residual, update, gate, mode=0):
        return _compute(residual, update, gate)

    def _residual_gate_add_transposed(residual, update, gate):
        raise AssertionError("transposed layout")
    @EXTRA@
    def _residual_gate_add_custom_op(residual, update, gate):
        return @DISPATCH@(residual, update, gate)

    def residual_gate_add_cuda(residual, update, gate):
        if update.shape != residual.shape or gate.shape != residual.shape:
            raise RuntimeError("unsupported input for residual_gate_add CUDA")
        return _residual_gate_add_custom_op(residual, update, gate)
    """)
SGL_RGA_TRITON = """
def _residual_gate_add_triton(residual, update, gate):
    return _compute(residual, update, gate)
"""

VO_OPS = FAKE_NOTE + textwrap.dedent("""
    import torch
    CALLS = []

    def indexed_gate(x, gate, other, indices):
        CALLS.append({"op": "indexed_gate", "x": x, "gate": gate, "other": other,
                      "indices": indices})
        return (x.float() + gate.index_select(0, indices).float() * other.float()).to(x.dtype)

    def indexed_gate_rms_norm_scale_shift(residual, gate, branch, weight, shift, scale,
                                          indices, eps):
        CALLS.append({"op": "fused", "residual": residual, "gate": gate, "branch": branch,
                      "weight": weight, "shift": shift, "scale": scale, "indices": indices,
                      "eps": eps})
        out = indexed_gate(residual, gate, branch, indices)
        return out, torch.full_like(out, float("nan"))
    """)

RLK_OP = FAKE_NOTE + textwrap.dedent("""
    import torch
    KERNEL_ID = "fake._C.h3_gate_residual_forward"
    BACKWARD_KERNEL_ID = "fake._C.h3_gate_residual_backward"
    BUILT = @BUILT@
    CALLS = []

    def h3_gate_residual_available():
        return BUILT

    class H3GateResidualCudaOp:
        def __call__(self, residual, y, gate, index):
            if index.dtype != torch.int64:
                raise TypeError("index must be a 1-D int64 tensor on the residual's device")
            CALLS.append({"residual": residual, "y": y, "gate": gate, "index": index})
            return residual + gate.index_select(0, index) * y
    """)



def rl_kernel_op(*, built: bool) -> str:
    """The fake RL-Kernel module, its extension built or not."""
    return RLK_OP.replace("@BUILT@", str(built))


DIST_INFO = "Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.0+fake\n"


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Write fake modules (``{"dotted.module": source}``) and dist-info under ``tmp_path``,
    first on ``sys.path``; every fake module is unloaded before and after the test."""

    def unload():
        for name in [m for m in sys.modules if m.split(".")[0] in FAKE_ROOTS]:
            del sys.modules[name]

    def write(modules: dict[str, str], distributions=()):
        for dotted, source in modules.items():
            parts = dotted.split(".")
            for i in range(1, len(parts)):
                package = tmp_path.joinpath(*parts[:i])
                package.mkdir(exist_ok=True)
                (package / "__init__.py").touch()
            tmp_path.joinpath(*parts[:-1], parts[-1] + ".py").write_text(source)
        for dist in distributions:
            info = tmp_path / f"{dist.replace('-', '_')}-0.0.0+fake.dist-info"
            info.mkdir(exist_ok=True)
            (info / "METADATA").write_text(DIST_INFO.format(name=dist))
        importlib.invalidate_caches()

    unload()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(library, "OBSERVED", {})
    yield write
    unload()


def on_cpu(monkeypatch, impl) -> None:
    """Let ``impl`` run on the cpu target in cells of this test (its call path unchanged)."""
    monkeypatch.setitem(implementations.registry("gate_residual"), impl.name,
                        dataclasses.replace(impl, targets=("cpu", "cuda")))


def cpu_cell(impls, **problem):
    data = {"schema_version": 1, "op": "gate_residual",
            "problem": {"D": 64, "G": 3, "dtype": "bfloat16", "index_dtype": "int64",
                        "seed": 20261129, **problem},
            "cases": [{"n": 37}], "implementations": ["eager", "fp64", *impls],
            "baseline": "eager", "accuracy_reference": "fp64", "repeats": 2,
            "timing": {"warmup": 0, "iters": 1}, "modes": {"plain": {}},
            "stacks": {"host": {"kind": "host"}}, "targets": ["cpu"]}
    m = parse_matrix(yaml.safe_load(yaml.safe_dump(data)),
                     known_implementations=implementations.known)
    return run_cell(m, Cell("host", "plain", "cpu"), select_cases(m), timings=False)


def small_inputs(dtype="bfloat16", index_dtype="int64", n=11):
    return make_inputs(n=n, d=48, g=4, dtype=dtype, index_dtype=index_dtype, seed=5,
                       specials=False).tensors


def bits_equal(a, b) -> bool:
    return a.shape == b.shape and torch.equal(compare.bits(a), compare.bits(b))


# --- the unavailable path ------------------------------------------------------------------


@pytest.mark.parametrize("name", LIBRARY_NAMES)
def test_absent_library_is_unavailable_naming_each_exact_import(fake, name):
    impl = implementations.get(name)
    why = impl.unavailable_reason("cuda")
    modules = [entry.partition(":")[0] for entry in impl.entries]
    for module in modules:
        assert f"import {module} failed: ModuleNotFoundError: No module named " in why
    assert why.count("failed:") == len(modules)
    assert impl.ran() == " | ".join(impl.entries)


def test_absent_libraries_are_unavailable_in_a_cell_which_goes_on(fake):
    r = cpu_cell(LIBRARY_NAMES)
    assert r["status"] == "ok" and r["results"]["eager"]["status"] == "ok"
    for name in LIBRARY_NAMES:
        entry = r["results"][name]
        assert entry["status"] == "unavailable"
        assert entry["reason"] == f"{name} does not run on target 'cpu'"
        assert entry["code_path"] == implementations.get(name).ran()
        assert entry["sha256"] == {}


def test_module_without_the_function_is_unavailable_and_names_it(fake):
    fake({"vllm_omni.diffusion.layers.indexed_modulation": "X = 1\n"})
    why = vllm_omni_ops.GATED_RESIDUAL.unavailable_reason("cuda")
    assert why.startswith("vllm_omni.diffusion.layers.indexed_modulation has no 'indexed_gate'")
    assert "import vllm_omni.diffusion.attention.ops.minimax_h3_modulation failed" in why


def test_a_package_that_fails_as_it_loads_is_unavailable_with_its_error(fake):
    fake({"sglang.kernels.kda_kernels.residual_gate_add_jit": "import triton\n"})
    why = sglang_ops.RESIDUAL_GATE_ADD.unavailable_reason("cuda")
    assert why == ("import sglang.kernels.kda_kernels.residual_gate_add_jit failed: "
                   "ModuleNotFoundError: No module named 'triton'")


def test_rl_kernel_without_its_built_extension_is_unavailable(fake):
    fake({rl_kernel_ops.MODULE: rl_kernel_op(built=False)})
    why = rl_kernel_ops.RL_KERNEL_H3.unavailable_reason("cuda")
    assert why.startswith(f"{rl_kernel_ops.MODULE}.h3_gate_residual_available() is False")
    fake({rl_kernel_ops.MODULE: rl_kernel_op(built=True)})
    sys.modules.pop(rl_kernel_ops.MODULE)
    assert rl_kernel_ops.RL_KERNEL_H3.unavailable_reason("cuda") is None


# --- wiring: SGLang ------------------------------------------------------------------------


def test_sglang_indexed_gate_gets_our_tensors_in_its_order(fake):
    fake({sglang_ops.TRITON: SGL_TRITON}, ["sglang"])
    impl = sglang_ops.INDEXED_GATE_TRITON
    assert impl.available("cuda")
    x = small_inputs()
    got = impl.run({k: v.clone() for k, v in x.items()}, backward=False)
    (call,) = sys.modules[sglang_ops.TRITON].CALLS
    assert bits_equal(call["x"], x["residual"]) and bits_equal(call["gate"], x["gate"])
    assert bits_equal(call["other"], x["y"]) and torch.equal(call["indices"], x["index"])
    assert not call["in_place"] and set(got) == {"out"}
    assert bits_equal(got["out"], eager_run(dict(x), backward=False)["out"])
    assert impl.ran() == (f"{sglang_ops.TRITON}:indexed_gate_bf16 -> Triton "
                          "_indexed_gate_bf16_kernel [sglang 0.0.0+fake]")


def test_sglang_indexed_gate_refuses_other_dtypes_before_calling(fake):
    fake({sglang_ops.TRITON: SGL_TRITON})
    module = importlib.import_module(sglang_ops.TRITON)
    with pytest.raises(TypeError, match="indexed_gate_bf16 takes bfloat16 rows only, got float16"):
        sglang_ops.run_indexed_gate_triton(small_inputs("float16"), backward=False)
    assert module.CALLS == []
    assert sglang_ops.INDEXED_GATE_TRITON.dtypes == ("bfloat16",)  # the cell skips others


def test_sglang_in_place_kernel_is_reported_as_mutating_residual(fake, monkeypatch):
    fake({sglang_ops.TRITON: SGL_TRITON}, ["sglang"])
    for impl in (sglang_ops.INDEXED_GATE_TRITON, sglang_ops.INDEXED_GATE_TRITON_INPLACE):
        on_cpu(monkeypatch, impl)
    r = cpu_cell(["sglang_indexed_gate_triton", "sglang_indexed_gate_triton_inplace"])
    inplace = r["results"]["sglang_indexed_gate_triton_inplace"]
    assert inplace["status"] == "ok" and inplace["mutated_inputs"] == {"37": ["residual"]}
    assert inplace["reason"] == "mutates its inputs: case 37: residual"
    assert r["results"]["sglang_indexed_gate_triton"]["mutated_inputs"] == {"37": []}
    assert r["results"]["sglang_indexed_gate_triton"]["reason"] is None
    assert all(c["in_place"] for c in sys.modules[sglang_ops.TRITON].CALLS[-2:])
    for name in ("sglang_indexed_gate_triton", "sglang_indexed_gate_triton_inplace"):
        assert r["results"][name]["vs eager"]["37"]["out"][0]["differ"] == 0
        assert r["results"][name]["code_path"].endswith("[sglang 0.0.0+fake]")


def rga_layout(version: str, dispatch: str | None = None) -> str:
    """The fake residual_gate_add_jit of sglang ``version`` ("0.5.23" or "0.5.21");
    ``dispatch`` overrides the backend its custom op calls."""
    default = "_residual_gate_add_triton" if version == "0.5.21" else "_residual_gate_add_cuda_impl"
    return (SGL_RGA.replace("@EXTRA@", SGL_RGA_TRITON if version == "0.5.21" else "")
            .replace("@DISPATCH@", dispatch or default))


@pytest.mark.parametrize("version, backend, label", [
    ("0.5.23", "_residual_gate_add_cuda_impl", "JIT CUDA"),
    ("0.5.21", "_residual_gate_add_triton", "Triton _rga_flat"),
])
def test_sglang_residual_gate_add_gets_a_pre_gathered_gate_and_records_its_backend(
        fake, monkeypatch, version, backend, label):
    fake({sglang_ops.RGA: rga_layout(version)}, ["sglang"])
    impl = sglang_ops.RESIDUAL_GATE_ADD
    predicted = impl.ran()
    assert predicted.startswith(f"{sglang_ops.RGA}:residual_gate_add_cuda -> {backend} ({label}")
    on_cpu(monkeypatch, impl)
    r = cpu_cell(["sglang_residual_gate_add_jit"], index_dtype="int32")
    entry = r["results"]["sglang_residual_gate_add_jit"]
    assert entry["status"] == "ok" and entry["code_path"] == predicted
    assert library.OBSERVED == {"sglang_residual_gate_add_jit": backend}
    assert set(entry["sha256"]["37"]) == {"out"} and "grads" not in entry["vs eager"]["37"]
    assert entry["vs eager"]["37"]["out"][0]["differ"] == 0
    x = make_inputs(n=37, d=64, g=3, dtype="bfloat16", index_dtype="int32", seed=20261129,
                    specials=False).tensors
    call = sys.modules[sglang_ops.RGA].CALLS[0]
    assert call["gate"].shape == x["residual"].shape
    assert bits_equal(call["gate"], x["gate"].index_select(0, x["index"]))
    assert bits_equal(call["update"], x["y"]) and bits_equal(call["residual"], x["residual"])


def test_sglang_residual_gate_add_fails_when_another_backend_runs_than_recorded(
        fake, monkeypatch):
    fake({sglang_ops.RGA: rga_layout("0.5.21", dispatch="_residual_gate_add_cuda_impl")})
    impl = sglang_ops.RESIDUAL_GATE_ADD
    assert "-> _residual_gate_add_triton" in impl.ran()
    with pytest.raises(library.CodePathChanged, match="ran _residual_gate_add_cuda_impl, "
                       "but the report records _residual_gate_add_triton"):
        impl.run(small_inputs(), backward=False)
    on_cpu(monkeypatch, impl)
    r = cpu_cell(["sglang_residual_gate_add_jit"])
    entry = r["results"]["sglang_residual_gate_add_jit"]
    assert entry["status"] == "error" and "CodePathChanged" in entry["reason"]
    assert r["status"] == "error"


def test_watched_functions_are_restored_after_a_call(fake):
    fake({sglang_ops.RGA: rga_layout("0.5.23")})
    sglang_ops.RESIDUAL_GATE_ADD.run(small_inputs(), backward=False)
    module = sys.modules[sglang_ops.RGA]
    assert module._residual_gate_add_cuda_impl.__qualname__ == "_residual_gate_add_cuda_impl"


# --- wiring: vllm-omni ---------------------------------------------------------------------


@pytest.mark.parametrize("module", [vllm_omni_ops.LAYERS, vllm_omni_ops.ATTENTION_OPS])
def test_vllm_omni_gated_residual_imports_either_layout(fake, module):
    fake({module: VO_OPS}, ["vllm-omni"])
    impl = vllm_omni_ops.GATED_RESIDUAL
    assert impl.available("cuda")
    assert impl.ran() == (f"{module}:indexed_gate -> Triton _indexed_gate_kernel "
                          "[vllm-omni 0.0.0+fake]")
    x = small_inputs("float16", "int32")
    got = impl.run({k: v.clone() for k, v in x.items()}, backward=False)
    (call,) = sys.modules[module].CALLS
    assert bits_equal(call["x"], x["residual"]) and bits_equal(call["gate"], x["gate"])
    assert bits_equal(call["other"], x["y"]) and torch.equal(call["indices"], x["index"])
    want = (x["residual"].float() + x["gate"][x["index"].long()].float() * x["y"].float())
    assert bits_equal(got["out"], want.half())


def test_vllm_omni_h3_fused_takes_residual_out_with_neutral_norm_arguments(fake, monkeypatch):
    fake({vllm_omni_ops.LAYERS: VO_OPS}, ["vllm-omni"])
    impl = vllm_omni_ops.H3_FUSED
    x = small_inputs()
    got = impl.run({k: v.clone() for k, v in x.items()}, backward=False)
    fused = next(c for c in sys.modules[vllm_omni_ops.LAYERS].CALLS if c["op"] == "fused")
    assert bits_equal(fused["residual"], x["residual"]) and bits_equal(fused["branch"], x["y"])
    assert bits_equal(fused["gate"], x["gate"]) and torch.equal(fused["indices"], x["index"])
    assert torch.equal(fused["weight"], torch.ones(48, dtype=torch.bfloat16))
    assert fused["shift"].shape == x["gate"].shape and not fused["shift"].any()
    assert not fused["scale"].any() and fused["eps"] == vllm_omni_ops.H3_EPS
    assert set(got) == {"out"} and not got["out"].isnan().any()
    on_cpu(monkeypatch, impl)
    r = cpu_cell(["vllm_omni_h3_fused"])
    entry = r["results"]["vllm_omni_h3_fused"]
    assert entry["status"] == "ok" and entry["mutated_inputs"] == {"37": []}
    assert entry["code_path"] == (f"{vllm_omni_ops.LAYERS}:indexed_gate_rms_norm_scale_shift -> "
                                  "Triton _indexed_gate_rms_norm_scale_shift_kernel "
                                  "[vllm-omni 0.0.0+fake]")


# --- wiring: RL-Kernel ---------------------------------------------------------------------


def test_rl_kernel_runs_with_backward_and_an_int64_index(fake, monkeypatch):
    fake({rl_kernel_ops.MODULE: rl_kernel_op(built=True)}, ["RL-Kernel"])
    impl = rl_kernel_ops.RL_KERNEL_H3
    assert impl.has_backward and impl.available("cuda")
    assert impl.ran() == (f"{rl_kernel_ops.MODULE}:H3GateResidualCudaOp -> "
                          "fake._C.h3_gate_residual_forward; backward "
                          "fake._C.h3_gate_residual_backward [RL-Kernel 0.0.0+fake]")
    on_cpu(monkeypatch, impl)
    r = cpu_cell(["rl_kernel_h3"], index_dtype="int32")
    entry = r["results"]["rl_kernel_h3"]
    assert entry["status"] == "ok" and set(entry["sha256"]["37"]) == {"out", "res", "y", "gate"}
    cmp = entry["vs eager"]["37"]
    assert cmp["out"][0]["differ"] == 0
    assert cmp["grads"]["res"]["differ"] == 0 and cmp["grads"]["y"]["differ"] == 0
    assert all(c["index"].dtype == torch.int64 for c in sys.modules[rl_kernel_ops.MODULE].CALLS)
