"""The RMSNorm ops' library rows (ops/{rms_norm,add_rms_norm,rms_norm_scale_shift}/libraries.py)
and what they load: the kernel wheelhouse's liger-kernel and vllm modules, vllm's stand-ins,
the opt-in compiled extension, and vllm-omni's CPU branch on the cpu target.

Real wheels where they are small (liger-kernel 0.8.4 / 0.8.5, 0.9 MB each; vllm-omni 0.28.0 /
0.30.0, 7-8 MB), fetched once into the wheel cache of tests/test_kernel_only.py (no network
and no cached wheel is a failure that says so). vllm's wheels are 315 MB: a FABRICATED vllm
wheel stands for them here, with the same import lines as ``batch_invariant.py`` and package
``__init__`` files that raise if run. The gpu-marked tests at the end run every row on small
inputs against a float64 reference (they need the real wheelhouse: ``python -m
runner.wheelhouse --matrix <norm matrix> --extensions``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from test_kernel_only import CACHE, triton_importable  # noqa: F401 - a fixture

from gate_residual_matrix.contract import extension, extension_files, kernel_only, versioned
from gate_residual_matrix.contract.library import LibraryMissing
from gate_residual_matrix.ops.add_rms_norm import libraries as add_libs
from gate_residual_matrix.ops.rms_norm import libraries as rms_libs
from gate_residual_matrix.ops.rms_norm_scale_shift import libraries as mod_libs
from gate_residual_matrix.runner import wheelhouse

LIGER = ("0.8.4", "0.8.5")
OMNI = ("0.28.0", "0.30.0")
FAKE_VLLM = "0.0.1"
BI = rms_libs.VLLM_BATCH_INVARIANT


@pytest.fixture(autouse=True)
def fresh_caches(monkeypatch):
    monkeypatch.setattr(kernel_only, "_LOADED", {})
    monkeypatch.setattr(kernel_only, "_MODULES", {})
    monkeypatch.setattr(kernel_only, "TOUCHED", [])
    monkeypatch.setattr(extension, "_CLAIMED", {})
    monkeypatch.setattr(extension, "_LOCATED", {})


def test_row_names_are_the_contracts():
    def names(libs):
        return [row.name for row in libs.LIBRARIES]

    assert names(rms_libs) == ["liger_rms_norm_llama", "liger_rms_norm_gemma",
                               "liger_rms_norm_none", "vllm_rms_norm_batch_invariant",
                               "vllm_rms_norm_cuda"]
    assert names(add_libs) == ["liger_fused_add_rms_norm_llama", "liger_fused_add_rms_norm_gemma",
                               "liger_fused_add_rms_norm_none", "vllm_fused_add_rms_norm_cuda"]
    assert names(mod_libs) == ["liger_modulated_rms_norm_llama",
                               "liger_modulated_rms_norm_gemma", "liger_modulated_rms_norm_none",
                               "vllm_omni_rms_norm_scale_shift", "vllm_omni_h3_fused_modulated"]
    for libs in (rms_libs, add_libs, mod_libs):
        for row in libs.LIBRARIES:
            assert row.has_backward == row.name.startswith("liger_")
            assert row.targets == (("cuda", "cpu") if row.name.startswith("vllm_omni")
                                   else ("cuda",))


# --- a fabricated vllm wheel ------------------------------------------------------------------

RAISE = 'raise RuntimeError("kernel-only loading ran this file")\n'
FAKE_BI = '''import torch
import vllm.envs as envs
from vllm.model_executor.determinism.batch_invariant_configs import _get_matmul_config
from vllm.platforms import current_platform
from vllm.triton_utils import tl, triton
from vllm.utils.mem_utils import get_max_shared_memory_bytes
from vllm.utils.platform_utils import num_compute_units
from vllm.utils.torch_utils import is_torch_equal_or_newer


def rms_norm_batch_invariant(input, weight, eps=1e-6, residual=None):
    return (input.float() * torch.rsqrt(input.float().pow(2).mean(-1, keepdim=True) + eps)
            * weight.float()).to(input.dtype)


def swallows_a_stand_in(input, weight, eps=1e-6):
    try:
        current_platform.is_cuda()
    except Exception:
        pass
    return input


def reads_envs(input, weight, eps=1e-6):
    return envs.VLLM_BATCH_INVARIANT
'''
FAKE_CONFIGS = '''from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability


def _get_matmul_config(capability: DeviceCapability | None = None):
    return None
'''


def fake_vllm_wheel(folder: Path, so: bytes = b"\x7fELF not a library") -> Path:
    """vllm-0.0.1-py3-none-any.whl: batch_invariant.py and its configs, package __init__ and
    stand-in targets that raise if run, an extension file, METADATA pinning torch==9.9.9."""
    files = {
        "vllm/__init__.py": RAISE, "vllm/envs.py": RAISE, "vllm/platforms/__init__.py": RAISE,
        "vllm/platforms/interface.py": RAISE, "vllm/triton_utils/__init__.py": RAISE,
        "vllm/utils/__init__.py": RAISE, "vllm/utils/mem_utils.py": RAISE,
        "vllm/model_executor/__init__.py": RAISE,
        "vllm/model_executor/determinism/__init__.py": RAISE,
        "vllm/model_executor/determinism/batch_invariant.py": FAKE_BI,
        "vllm/model_executor/determinism/batch_invariant_configs.py": FAKE_CONFIGS,
        f"vllm-{FAKE_VLLM}.dist-info/METADATA": ("Metadata-Version: 2.1\nName: vllm\n"
                                                 "Requires-Dist: torchaudio==1.0\n"
                                                 "Requires-Dist: torch==9.9.9\n"),
    }
    data = {k: v.encode() for k, v in files.items()}
    data["vllm/_C_stable_libtorch.abi3.so"] = so
    record = "".join(
        f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).decode().rstrip('=')}"
        f",{len(b)}\n" for p, b in data.items())
    record += f"vllm-{FAKE_VLLM}.dist-info/RECORD,,\n"
    wheel = folder / f"vllm-{FAKE_VLLM}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, content in data.items():
            zf.writestr(path, content)
        zf.writestr(f"vllm-{FAKE_VLLM}.dist-info/RECORD", record)
    return wheel


@pytest.fixture
def fake_house(tmp_path) -> Path:
    root = tmp_path / "house"
    wheelhouse.extract(fake_vllm_wheel(tmp_path), "vllm", FAKE_VLLM, root, extensions=True)
    return root


def test_vllm_modules_are_cut_off_and_listed_as_foreign(fake_house):
    manifest = json.loads(wheelhouse.manifest_path(fake_house, "vllm", FAKE_VLLM).read_text())
    info = manifest["modules"][BI]
    assert info["status"] == "found" and info["problems"] == []
    assert info["files"] == ["vllm/model_executor/determinism/batch_invariant.py",
                             "vllm/model_executor/determinism/batch_invariant_configs.py"]
    assert info["foreign"]["vllm.platforms"] == ["current_platform"]
    assert info["foreign"]["vllm.envs"] == []
    assert "optional" not in info  # only where a module has try-imports


@pytest.mark.usefixtures("triton_importable")
def test_vllm_stand_ins_are_recorded_and_its_package_inits_never_run(fake_house):
    loaded, _ = kernel_only.load(fake_house, "vllm", FAKE_VLLM, BI)
    assert set(loaded.stand_ins) == {"vllm.envs", "vllm.platforms", "vllm.platforms.interface",
                                     "vllm.utils.mem_utils", "vllm.utils.platform_utils",
                                     "vllm.utils.torch_utils"}
    assert set(loaded.substitutes) == {"vllm.triton_utils"}
    assert loaded.stand_ins["vllm.platforms"].startswith("current_platform: ")
    text = loaded.describe()
    assert "; stand-ins: vllm.envs (any attribute: " in text
    assert loaded.record()["stand_ins"] == loaded.stand_ins
    row = versioned.versioned(rms_libs.VLLM_RMS_NORM_BATCH_INVARIANT, FAKE_VLLM, fake_house)
    assert row.unavailable_reason("cuda") is None
    assert row.unavailable_reason("cpu") == f"{row.name} does not run on target 'cpu'"
    assert "stand-ins: vllm.envs" in row.ran() and row.record()["stand_ins"]
    x = torch.tensor([[3.0, -4.0]]).to(torch.bfloat16)
    out = row.run({"x": x, "weight": torch.ones(2, dtype=torch.bfloat16)}, backward=False)
    assert out["out"].dtype == torch.bfloat16 and kernel_only.TOUCHED == []


@pytest.mark.usefixtures("triton_importable")
def test_a_stand_in_used_fails_the_call_even_when_the_library_catches_it(fake_house):
    x, w = torch.ones(1, 2), torch.ones(2)
    for name in ("swallows_a_stand_in", "reads_envs"):
        row = versioned.versioned(
            rms_libs.VLLM_RMS_NORM_BATCH_INVARIANT, FAKE_VLLM, fake_house)
        row = type(row)(**{**row.__dict__, "entries": (f"{BI}:{name}",)})
        with pytest.raises(kernel_only.StandInTouched) as err:
            row.call(x, w)
        assert "kernel-only stand-in" in str(err.value) and "\n" not in str(err.value)
    assert kernel_only.TOUCHED == ["vllm.platforms.current_platform.is_cuda",
                                   "vllm.envs.VLLM_BATCH_INVARIANT"]


def test_the_extension_is_kept_with_its_torch_pin_and_checked(fake_house, tmp_path):
    folder = extension_files.directory(fake_house, "vllm", FAKE_VLLM)
    info = json.loads((folder / "extension.json").read_text())
    assert info["requires_torch"] == "==9.9.9"  # torch, not torchaudio
    assert info["path"] == "vllm/_C_stable_libtorch.abi3.so"
    assert info["wheel"]["filename"] == f"vllm-{FAKE_VLLM}-py3-none-any.whl"
    file, kept = extension_files.kept(fake_house, "vllm", FAKE_VLLM, info["path"])
    assert file.read_bytes() == b"\x7fELF not a library" and kept == info
    (folder / file.name).write_bytes(b"changed")
    with pytest.raises(extension_files.ExtensionMissing, match="does not match its extension"):
        extension_files.kept(fake_house, "vllm", FAKE_VLLM, info["path"])
    assert extension_files.torch_requirement("Requires-Dist: torch (>=2.4) ; extra == 'x'") \
        == ">=2.4"
    assert extension_files.torch_requirement("Requires-Dist: torchvision==0.1") is None


def test_extension_rows_unavailable_in_one_line(fake_house, tmp_path):
    for impl in (rms_libs.VLLM_RMS_NORM_CUDA, add_libs.VLLM_FUSED_ADD_RMS_NORM_CUDA):
        row = versioned.versioned(impl, FAKE_VLLM, fake_house)
        assert isinstance(row, extension.ExtensionImplementation)
        assert row.unavailable_reason("cpu") == f"{row.name} does not run on target 'cpu'"
        why = row.unavailable_reason("cuda")  # not an ELF library: the load fails
        assert why.startswith(f"vllm {FAKE_VLLM}: torch.ops.load_library("
                              "_C_stable_libtorch.abi3.so) failed: ") and "\n" not in why
        assert row.record() is None and "not loaded" in row.ran()
        missing = versioned.versioned(impl, "0.30.0", tmp_path / "empty")
        why = missing.unavailable_reason("cuda")
        assert why.startswith("no _C_stable_libtorch.abi3.so of vllm 0.30.0 beside the kernel "
                              "wheelhouse") and "--extensions" in why and "\n" not in why


def test_one_extension_version_per_process(fake_house, monkeypatch):
    row = versioned.versioned(rms_libs.VLLM_RMS_NORM_CUDA, FAKE_VLLM, fake_house)
    monkeypatch.setitem(extension._CLAIMED, "_C", ("vllm 0.30.0", "/elsewhere/_C.so"))
    why = row.unavailable_reason("cuda")
    assert why == ("torch.ops._C already holds vllm 0.30.0's _C.so in this process (torch "
                   f"registers an op namespace once): run vllm {FAKE_VLLM}'s rows in a "
                   "process of their own")
    with pytest.raises(LibraryMissing):
        row.run({"x": torch.ones(1, 2), "weight": torch.ones(2)}, backward=False)


# --- wheelhouse ------------------------------------------------------------------------------

def test_closure_cuts_modules_and_treats_try_imports_as_optional():
    read = {"pkg/a.py": (b"try:\n    import peft\nexcept ImportError:\n    peft = None\n"
                         b"try:\n    from x.fast import f\nexcept ModuleNotFoundError:\n"
                         b"    from x.slow import f\n"
                         b"import torch\nfrom pkg.cut import thing\nfrom pkg.b import Y\n"),
            "pkg/b.py": b"try:\n    from pkg.gone import z\nexcept Exception:\n    z = 0\nY = 1\n",
            "pkg/cut.py": b"import serving_stack\n"}
    found = wheelhouse.closure("pkg.a", read, {"pkg"}, cut=("pkg.cut",))
    assert set(found.files) == {"pkg/a.py", "pkg/b.py"}
    assert found.foreign == {"torch": [], "pkg.cut": ["thing"]}
    assert found.optional == ["peft", "x.fast", "x.slow"] and found.problems == []
    unguarded = {"pkg/c.py": b"try:\n    import peft\nexcept ImportError:\n    pass\nimport peft\n"}
    assert wheelhouse.closure("pkg.c", unguarded, {"pkg"}).foreign == {"peft": []}


def test_main_takes_the_union_of_several_matrix_files(tmp_path, monkeypatch):
    one, two = tmp_path / "one.yaml", tmp_path / "two.yaml"
    one.write_text("libraries: {versions: {vllm-omni: ['0.30.0'], vllm: ['0.30.0']}}\n")
    two.write_text("libraries: {versions: {vllm: ['0.30.0', '0.33.0'], "
                   "liger-kernel: ['0.8.5']}}\n")
    seen = {}

    def build(versions, root, cache=None, extensions=False):
        seen.update(versions=versions, extensions=extensions)
        return []

    monkeypatch.setattr(wheelhouse, "build", build)
    assert wheelhouse.main(["--matrix", str(one), "--matrix", str(two), "--out",
                            str(tmp_path / "h"), "--extensions"]) == 0
    assert seen == {"versions": {"vllm-omni": ["0.30.0"], "vllm": ["0.30.0", "0.33.0"],
                                 "liger-kernel": ["0.8.5"]}, "extensions": True}


# --- real wheels: liger-kernel and vllm-omni -------------------------------------------------

@pytest.fixture(scope="module")
def house(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("norm-wheelhouse")
    try:
        wheelhouse.build({"liger-kernel": LIGER, "vllm-omni": OMNI}, root, cache=CACHE)
    except wheelhouse.WheelhouseError as err:
        pytest.fail(f"cannot fetch the liger-kernel / vllm-omni wheels: {err}")
    return root


def test_liger_manifests_keep_three_files_and_its_try_imports_optional(house):
    for version in LIGER:
        manifest = json.loads(wheelhouse.manifest_path(house, "liger-kernel", version)
                              .read_text())
        for module in wheelhouse.kernel_modules()["liger-kernel"]:
            info = manifest["modules"][module]
            assert info["status"] == "found"
            assert info["files"] == sorted([wheelhouse.module_path(module),
                                            "liger_kernel/ops/utils.py",
                                            "liger_kernel/utils.py"])
            assert "peft" in info["optional"] and "peft" not in info["foreign"]
    omni = json.loads(wheelhouse.manifest_path(house, "vllm-omni", "0.30.0").read_text())
    assert all("optional" not in info for info in omni["modules"].values())


def test_liger_rows_are_cuda_only_and_load_kernel_only_where_triton_is(house):
    rows = [versioned.versioned(impl, v, house) for libs in (rms_libs, add_libs, mod_libs)
            for impl in libs.LIGER_ROWS for v in LIGER]
    assert len(rows) == 18
    for row in rows:
        assert row.unavailable_reason("cpu") == f"{row.name} does not run on target 'cpu'"
    triton = kernel_only._available("triton")
    for row in rows:
        why = row.unavailable_reason("cuda")  # the availability of the load, not of a GPU
        if triton:
            assert why is None
            assert f"[kernel-only liger-kernel {row.version}, wheel liger_kernel-" in row.ran()
            assert row.ran().split(" ->")[0].endswith("Function.apply")
            assert set(row.record()["withheld"]) == {"peft", "transformers"}
        else:  # Liger imports triton itself: no stand-in
            assert "triton" in why and "\n" not in why


@pytest.mark.usefixtures("triton_importable")
@pytest.mark.parametrize("version", OMNI)
def test_vllm_omni_rows_run_their_cpu_branch_on_the_cpu_target(house, version):
    plain = versioned.versioned(mod_libs.VLLM_OMNI_RMS_NORM_SCALE_SHIFT, version, house)
    fused = versioned.versioned(mod_libs.VLLM_OMNI_H3_FUSED_MODULATED, version, house)
    assert plain.unavailable_reason("cpu") is None and fused.unavailable_reason("cpu") is None
    assert fused.dtypes == ("bfloat16",)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x, tensors = case(7, 64, 9, dtype, seed=3)
        x[0, :4] = torch.tensor([-0.0, 0.0, float("nan"), float("inf")], dtype=dtype)
        tensors["x"] = x
        out = plain.run(tensors, backward=False)["out"]
        assert out.dtype == dtype and out.shape == x.shape
        ref = reference_scale_shift(tensors)
        finite = torch.isfinite(ref).all(-1)  # row 0 has NaN and Inf
        assert close(out[finite], ref[finite], dtype)
        if dtype == torch.bfloat16:  # residual_out is x (-0.0 and NaN included): no raise
            same = fused.run(tensors, backward=False)["out"]
            assert torch.equal(same.view(torch.int16), out.view(torch.int16))  # one CPU branch
    assert f"[kernel-only vllm-omni {version}" in plain.ran()


def test_the_fused_row_refuses_a_residual_out_that_is_not_x(monkeypatch):
    x = torch.tensor([[1.0, -0.0]], dtype=torch.bfloat16)
    monkeypatch.setattr(mod_libs.VLLM_OMNI_H3_FUSED_MODULATED.__class__, "call",
                        lambda self, *a: (torch.zeros_like(a[0]), a[0]))
    tensors = {"x": x, "weight": torch.ones(2, dtype=x.dtype), "index": torch.zeros(1).long(),
               "scale": torch.zeros(1, 2, dtype=x.dtype), "shift": torch.zeros(1, 2,
                                                                               dtype=x.dtype)}
    with pytest.raises(RuntimeError, match="residual_out is not x"):
        mod_libs.run_omni_fused(tensors, backward=False)


# --- references and cases (shared with the gpu tests) -----------------------------------------

EPS = 1e-6


def case(n: int, d: int, g: int, dtype, seed: int) -> tuple[torch.Tensor, dict]:
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale + shift).to(dtype)

    x = rand(n, d)
    tensors = {"x": x, "residual": rand(n, d), "weight": rand(d, scale=0.1, shift=1.0),
               "scale": rand(g, d, scale=0.1), "shift": rand(g, d, scale=0.1),
               "index": torch.randint(0, g, (n,), generator=gen), "grad_out": rand(n, d),
               "grad_h": rand(n, d)}
    return x, tensors


def _norm(h, weight):
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * weight


def reference_scale_shift(t):
    d = {k: v.double().cpu() for k, v in t.items() if v.is_floating_point()}
    index = t["index"].cpu()
    return _norm(d["x"], d["weight"]) * (1 + d["scale"][index]) + d["shift"][index]


def reference(op: str, t: dict) -> dict[str, torch.Tensor]:
    """The op in float64 with autograd (add_rms_norm's h rounded to the storage dtype)."""
    d = {k: v.detach().double().cpu().requires_grad_() for k, v in t.items()
         if v.is_floating_point() and not k.startswith("grad")}
    if op == "rms_norm":
        out = _norm(d["x"], d["weight"])
        grads = torch.autograd.grad(out, (d["x"], d["weight"]), t["grad_out"].double().cpu())
        return {"out": out.detach(), "x": grads[0], "weight": grads[1]}
    if op == "add_rms_norm":
        h = d["x"] + d["residual"]
        rounded = h + (h.detach().to(t["x"].dtype).double() - h.detach())  # value rounded
        out = _norm(rounded, d["weight"])
        ups = (t["grad_out"].double().cpu(), t["grad_h"].double().cpu())
        grads = torch.autograd.grad((out, rounded), (d["x"], d["residual"], d["weight"]), ups)
        return {"out": out.detach(), "h": rounded.detach(), "x": grads[0],
                "residual": grads[1], "weight": grads[2]}
    index = t["index"].cpu()
    out = _norm(d["x"], d["weight"]) * (1 + d["scale"][index]) + d["shift"][index]
    grads = torch.autograd.grad(out, (d["x"], d["weight"], d["scale"], d["shift"]),
                                t["grad_out"].double().cpu())
    return {"out": out.detach(), "x": grads[0], "weight": grads[1], "scale": grads[2],
            "shift": grads[3]}


#: the largest |a - ref| / max(|ref|max, 1) accepted, per storage dtype
TOLERANCE = {torch.bfloat16: 5e-2, torch.float16: 1e-2, torch.float32: 1e-4}


def close(got: torch.Tensor, ref: torch.Tensor, dtype) -> bool:
    scale = max(ref.abs().max().item(), 1.0) if ref.numel() else 1.0
    err = (got.double().cpu() - ref).abs().max().item() if ref.numel() else 0.0
    return err <= TOLERANCE[dtype] * scale


# --- on the GPU ------------------------------------------------------------------------------

GPU_VERSIONS = {"liger-kernel": LIGER, "vllm": ("0.30.0", "0.33.0"), "vllm-omni": OMNI}
OPS = {"rms_norm": rms_libs, "add_rms_norm": add_libs, "rms_norm_scale_shift": mod_libs}
TRITON_ROWS = [(op, impl.name, v) for op, libs in OPS.items() for impl in libs.LIBRARIES
               if not isinstance(impl, extension.ExtensionImplementation)
               for v in GPU_VERSIONS[impl.distribution]]


def run_row_on_gpu(op: str, name: str, version: str, dtype) -> dict[str, float]:
    """Run row ``name``-``version`` (default wheelhouse) on N = 33, D = 5376 on CUDA; the
    largest normalized error per output vs float64; AssertionError where unavailable."""
    impl = next(i for i in OPS[op].LIBRARIES if i.name == name)
    row = versioned.versioned(impl, version)
    why = row.unavailable_reason("cuda")
    assert why is None, why
    if row.dtypes and str(dtype).removeprefix("torch.") not in row.dtypes:
        return {}
    _, tensors = case(33, 5376, 9, dtype, seed=11)
    on_gpu = {k: v.cuda() for k, v in tensors.items()}
    before = {k: v.clone() for k, v in on_gpu.items()}
    got = row.run(on_gpu, backward=row.has_backward)
    for k, v in before.items():
        assert torch.equal(v, on_gpu[k]), f"{row.name} changed its input {k}"
    ref = reference(op, tensors)
    assert set(got) <= set(ref) and "out" in got
    return {k: ((v.double().cpu() - ref[k]).abs().max() / max(ref[k].abs().max(), 1)).item()
            for k, v in got.items()}


@pytest.mark.gpu
@pytest.mark.parametrize("op,name,version", TRITON_ROWS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_triton_rows_on_the_gpu_are_close_to_float64(op, name, version, dtype):
    errors = run_row_on_gpu(op, name, version, dtype)
    tol = TOLERANCE[dtype]
    if name.endswith("_none") and dtype != torch.float32:
        tol = 0.1  # Liger's casting_mode "none" computes in the storage dtype throughout
    bad = {k: e for k, e in errors.items() if e > tol}
    assert not bad, f"{name}-{version} {dtype}: {bad}"


CHILD = """
import json, sys, torch
sys.path[:0] = ["tests", "."]
import test_norm_libraries as t
out = {str(d): t.run_row_on_gpu(sys.argv[1], sys.argv[2], sys.argv[3], d)
       for d in (torch.bfloat16, torch.float16, torch.float32)}
print(json.dumps(out))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("op,name", [("rms_norm", "vllm_rms_norm_cuda"),
                                     ("add_rms_norm", "vllm_fused_add_rms_norm_cuda")])
@pytest.mark.parametrize("version", GPU_VERSIONS["vllm"])
def test_extension_rows_on_the_gpu_are_close_to_float64(op, name, version):
    """Each version in a process of its own: torch registers the ``_C`` namespace once. The
    extension is opt-in (``python -m gate_residual_matrix.runner.wheelhouse --extensions``,
    78-93 MB a version): a host without it skips, naming what is missing; a present file that
    fails, fails."""
    impl = next(i for i in OPS[op].LIBRARIES if i.name == name)
    why = versioned.versioned(impl, version).unavailable_reason("cuda")
    if why and "_C_stable_libtorch" in why:
        pytest.skip(why)
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", CHILD, op, name, version], cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    for dtype, per_output in errors.items():
        tol = TOLERANCE[getattr(torch, dtype.removeprefix("torch."))]
        assert per_output and all(e <= tol for e in per_output.values()), (dtype, per_output)
