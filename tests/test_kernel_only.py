"""Kernel-only library loading against real wheels, and the RL-Kernel tree's errors.

The wheels are vllm-omni 0.28.0 and 0.30.0 (7-8 MB each; the kernel module moved between
them), downloaded once with ``pip download --no-deps`` into a cache
(``$GATE_RESIDUAL_WHEEL_CACHE``, default ``~/.cache/gate-residual-matrix/wheels``). No
network and no cached wheel is a test failure that says so, never a skip.

Where triton is not installed (CI's CPU machine), a TEST-ONLY stand-in ``triton`` is put in
``sys.modules`` so the library's ``@triton.jit`` decorators can execute: the modules load,
nothing launches (library rows stay ``unavailable`` on the cpu target).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch

from gate_residual_matrix.contract import kernel_only, rl_kernel_tree, versioned
from gate_residual_matrix.ops.gate_residual import rl_kernel_ops, vllm_omni_ops
from gate_residual_matrix.runner import wheelhouse
from gate_residual_matrix.runner.cell import catalog as implementations
from gate_residual_matrix.runner.cell.catalog import get
from gate_residual_matrix.runner.config.matrix import parse_matrix
from gate_residual_matrix.runner.errors import ConfigError

VERSIONS = ("0.28.0", "0.30.0")
CACHE = Path(os.environ.get("GATE_RESIDUAL_WHEEL_CACHE")
             or Path.home() / ".cache" / "gate-residual-matrix" / "wheels")


@pytest.fixture(scope="session")
def house(tmp_path_factory) -> Path:
    """A wheelhouse of vllm-omni 0.28.0 and 0.30.0 built from the real wheels."""
    root = tmp_path_factory.mktemp("wheelhouse")
    try:
        wheelhouse.build({"vllm-omni": VERSIONS}, root, cache=CACHE)
    except wheelhouse.WheelhouseError as err:
        pytest.fail(f"cannot fetch the vllm-omni wheels (network or index down?): {err}")
    return root


@pytest.fixture
def triton_importable(monkeypatch):
    """Real triton where installed, else a TEST-ONLY stand-in whose decorators do nothing."""
    if importlib.util.find_spec("triton") is not None:
        return
    fake = types.ModuleType("triton", "TEST-ONLY stand-in (tests/test_kernel_only.py)")
    language = types.ModuleType("triton.language")

    def attr(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return object()

    language.__getattr__ = attr
    fake.language = language
    fake.jit = lambda fn=None, **kw: fn if fn is not None else (lambda f: f)
    monkeypatch.setitem(sys.modules, "triton", fake)
    monkeypatch.setitem(sys.modules, "triton.language", language)


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    monkeypatch.setattr(kernel_only, "_LOADED", {})
    monkeypatch.setattr(kernel_only, "_MODULES", {})


def test_manifests_name_wheel_files_and_the_version_without_the_module(house):
    m28 = json.loads(wheelhouse.manifest_path(house, "vllm-omni", "0.28.0").read_text())
    m30 = json.loads(wheelhouse.manifest_path(house, "vllm-omni", "0.30.0").read_text())
    assert m28["wheel"]["filename"] == "vllm_omni-0.28.0-py3-none-any.whl"
    assert len(m30["wheel"]["sha256"]) == 64
    assert m28["modules"][vllm_omni_ops.LAYERS] == {"status": "not in this version"}
    assert m30["modules"][vllm_omni_ops.ATTENTION_OPS] == {"status": "not in this version"}
    found = m30["modules"][vllm_omni_ops.LAYERS]
    assert found["files"] == ["vllm_omni/diffusion/layers/indexed_modulation.py"]
    assert found["foreign"]["vllm.triton_utils"] == ["tl", "triton"]
    size = sum(p.stat().st_size for p in house.rglob("*") if p.is_file())
    assert size < 200_000, "the wheelhouse should be kilobytes, not wheels"


def test_two_versions_load_side_by_side_without_package_init(house, triton_importable):
    before = set(sys.modules)
    l28, m28 = kernel_only.load(house, "vllm-omni", "0.28.0", vllm_omni_ops.ATTENTION_OPS)
    l30, m30 = kernel_only.load(house, "vllm-omni", "0.30.0", vllm_omni_ops.LAYERS)
    assert callable(m28.indexed_gate) and callable(m30.indexed_gate_rms_norm_scale_shift)
    assert m28.indexed_gate is not m30.indexed_gate
    assert l30.modules["vllm_omni"].__kernel_only_stand_in__  # its __init__ never ran
    assert set(l30.substitutes) == {"vllm.triton_utils"}
    assert not {n for n in set(sys.modules) - before if n.startswith(("vllm_omni", "vllm."))}
    with l28.active():
        assert sys.modules[vllm_omni_ops.ATTENTION_OPS] is m28
    assert vllm_omni_ops.ATTENTION_OPS not in sys.modules
    text = l28.describe()
    assert text.startswith("kernel-only vllm-omni 0.28.0, wheel vllm_omni-0.28.0-py3-none-any.whl")
    assert "minimax_h3_modulation.py sha256 " in text and "substitutes: vllm.triton_utils" in text


def test_versioned_rows_record_kernel_only_and_stay_unavailable_on_cpu(house, triton_importable):
    rows = [versioned.versioned(get(name), v, house)
            for name in ("vllm_omni_gated_residual", "vllm_omni_h3_fused") for v in VERSIONS]
    for row in rows:
        assert row.unavailable_reason("cpu") == f"{row.name} does not run on target 'cpu'"
        assert row.unavailable_reason("cuda") is None
        path = row.ran()
        assert f"[kernel-only vllm-omni {row.version}, wheel " in path
        assert f"torch {torch.__version__}, triton " in path
        assert row.record()["mode"] == "kernel-only"
    assert rows[0].ran().startswith(f"{vllm_omni_ops.ATTENTION_OPS}:indexed_gate ->")
    assert rows[1].ran().startswith(f"{vllm_omni_ops.LAYERS}:indexed_gate ->")


def test_a_module_absent_in_one_version_is_named_with_that_version(house, triton_importable):
    with pytest.raises(kernel_only.KernelOnlyError) as err:
        kernel_only.load(house, "vllm-omni", "0.28.0", vllm_omni_ops.LAYERS)
    assert str(err.value) == f"{vllm_omni_ops.LAYERS}: not in this version (vllm-omni 0.28.0)"
    row = versioned.versioned(get("vllm_omni_gated_residual"), "0.26.0", house)
    why = row.unavailable_reason("cuda")
    assert "has no vllm-omni 0.26.0" in why and "\n" not in why


def test_a_file_that_differs_from_record_is_refused_in_one_line(house, tmp_path,
                                                                 triton_importable):
    copy = tmp_path / "house"
    shutil.copytree(house, copy)
    manifest = json.loads(wheelhouse.manifest_path(copy, "vllm-omni", "0.30.0").read_text())
    path = "vllm_omni/diffusion/layers/indexed_modulation.py"
    obj = copy / "objects" / f"{manifest['files'][path]}.py"
    obj.write_bytes(obj.read_bytes() + b"\nprint('changed')\n")
    with pytest.raises(kernel_only.KernelOnlyError) as err:
        kernel_only.load(copy, "vllm-omni", "0.30.0", vllm_omni_ops.LAYERS)
    msg = str(err.value)
    assert msg.startswith(f"vllm-omni 0.30.0: {path} does not match the wheel's RECORD")
    assert "\n" not in msg
    assert vllm_omni_ops.LAYERS not in sys.modules


def test_no_wheelhouse_says_how_to_build_one(tmp_path):
    with pytest.raises(kernel_only.KernelOnlyError, match="nox -s kernel_wheelhouse"):
        kernel_only.load(tmp_path / "none", "sglang", "0.5.23", "sglang.x")


def test_closure_refuses_a_package_init_import():
    read = {"pkg/a.py": b"from pkg.sub import helper\nimport torch\n",
            "pkg/sub/__init__.py": b"helper = 1\n", "pkg/b.py": b"X = 1\n",
            "pkg/c.py": b"from . import b\nfrom .b import X\n"}
    found = wheelhouse.closure("pkg.a", read, {"pkg"})
    assert found.foreign == {"torch": []}
    assert found.problems == ["pkg.a imports 'helper' from pkg.sub: that is its package "
                              "__init__, which kernel-only loading does not run"]
    assert set(wheelhouse.closure("pkg.c", read, {"pkg"}).files) == {"pkg/c.py", "pkg/b.py"}


def test_libraries_section_expands_rows_and_rejects_a_bad_version():
    data = {"schema_version": 1, "op": "gate_residual",
            "problem": {"D": 64, "G": 3, "dtype": "bfloat16", "index_dtype": "int64",
                        "seed": 1},
            "cases": [{"n": 3}], "implementations": ["eager", "vllm_omni_gated_residual",
                                                     "rl_kernel_h3"],
            "baseline": "eager", "modes": {"plain": {}}, "stacks": {"host": {"kind": "host"}},
            "targets": ["cpu"], "libraries": {"versions": {"vllm-omni": list(VERSIONS)},
                                              "rl_kernel": "/nowhere"}}
    m = parse_matrix(data, known_implementations=("eager", "vllm_omni_gated_residual",
                                                  "rl_kernel_h3"))
    names = [r.name for r in implementations.rows(m)]
    assert names == ["eager", "vllm_omni_gated_residual-0.28.0",
                     "vllm_omni_gated_residual-0.30.0", "rl_kernel_h3"]
    data["libraries"]["versions"]["vllm-omni"] = ["0.30 beta"]
    with pytest.raises(ConfigError, match=r"libraries\.versions\.vllm-omni"):
        parse_matrix(data, known_implementations=("eager", "vllm_omni_gated_residual",
                                                  "rl_kernel_h3"))


# --- RL-Kernel source tree -------------------------------------------------------------------


def tree(tmp_path: Path, module: str = rl_kernel_ops.TREE_MODULES[0]) -> Path:
    """A minimal source tree with the op's module file and a PROVENANCE.json over it."""
    root = tmp_path / "rlk"
    path = root / (module.replace(".", "/") + ".py")
    path.parent.mkdir(parents=True)
    path.write_text("X = 1\n")
    import hashlib

    rel = path.relative_to(root).as_posix()
    (root / "PROVENANCE.json").write_text(json.dumps({"files": [
        {"path": rel, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}]}))
    return root


@pytest.fixture
def cuda_torch(monkeypatch, tmp_path):
    """torch reports a CUDA build, and nvcc is found in a fake CUDA_HOME."""
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "nvcc").write_text("")
    monkeypatch.setenv("CUDA_HOME", str(home))
    return home


def test_rl_kernel_bad_path_is_one_line(tmp_path):
    why = rl_kernel_tree.problem(tmp_path / "missing", rl_kernel_ops.TREE_MODULES)
    assert why.startswith(f"RL-Kernel source tree {tmp_path / 'missing'} does not exist")
    (tmp_path / "empty").mkdir()
    assert "has neither rl_engine/kernels/ops/cuda/h3/gate_residual.py nor " in \
        rl_kernel_tree.problem(tmp_path / "empty", rl_kernel_ops.TREE_MODULES)


def test_rl_kernel_cpu_torch_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    why = rl_kernel_tree.problem(tree(tmp_path), rl_kernel_ops.TREE_MODULES)
    assert why == (f"torch {torch.__version__} is a CPU build: RL-Kernel's CUDA extension "
                   "cannot be built or run")


def test_rl_kernel_no_nvcc_is_one_line(tmp_path, monkeypatch, cuda_torch):
    monkeypatch.delenv("CUDA_HOME")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    why = rl_kernel_tree.problem(tree(tmp_path), rl_kernel_ops.TREE_MODULES)
    assert why.startswith("no nvcc (not on PATH, not in $CUDA_HOME/bin)") and "\n" not in why


@pytest.mark.parametrize("module", rl_kernel_ops.TREE_MODULES)
def test_rl_kernel_either_module_path_is_accepted(tmp_path, cuda_torch, module):
    root = tree(tmp_path, module)
    assert rl_kernel_tree.problem(root, rl_kernel_ops.TREE_MODULES) is None
    row = versioned.on_tree(get("rl_kernel_h3"), root)
    assert [e.partition(":")[0] for e in row.entries] == list(rl_kernel_ops.TREE_MODULES)
    assert row.unavailable_reason("cpu") == "rl_kernel_h3 does not run on target 'cpu'"


def test_rl_kernel_tree_differing_from_provenance_and_its_digest(tmp_path, cuda_torch):
    root = tree(tmp_path)
    digest = rl_kernel_tree.provenance(root)
    assert digest.startswith(f"tree {root}, PROVENANCE.json sha256 ")
    (root / rl_kernel_ops.TREE_MODULES[0].replace(".", "/")).with_suffix(".py").write_text("X=2\n")
    assert rl_kernel_tree.problem(root, rl_kernel_ops.TREE_MODULES) == (
        f"RL-Kernel tree {root}: rl_engine/kernels/ops/cuda/h3/gate_residual.py does not "
        "match PROVENANCE.json")


def test_rl_kernel_tree_from_the_environment_wins(tmp_path, monkeypatch):
    monkeypatch.setenv(rl_kernel_tree.ENV_TREE, str(tmp_path))
    assert rl_kernel_tree.resolve("elsewhere") == tmp_path
    monkeypatch.delenv(rl_kernel_tree.ENV_TREE)
    assert rl_kernel_tree.resolve("rel/tree") == rl_kernel_tree.PROJECT_ROOT / "rel/tree"


def _probe_package(tmp_path: Path, monkeypatch, name: str) -> Path:
    """A package ``name`` on sys.path whose import appends to ``<name>.log``; it leaves
    ``sys.modules`` with the test."""
    pkg = tmp_path / name
    pkg.mkdir()
    log = tmp_path / f"{name}.log"
    (pkg / "__init__.py").write_text(f"open({str(log)!r}, 'a').write('imported\\n')\n")
    (pkg / "utils.py").write_text("ANSWER = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in (name, f"{name}.utils"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    return log


def test_withholding_makes_an_import_fail_and_puts_back_what_was_there(tmp_path, monkeypatch):
    log = _probe_package(tmp_path, monkeypatch, "probe_withheld")
    import probe_withheld.utils  # noqa: F401 - imported before: must come back after

    top, sub = sys.modules["probe_withheld"], sys.modules["probe_withheld.utils"]
    with kernel_only._withholding(("probe_withheld",)):
        for name in ("probe_withheld", "probe_withheld.utils"):
            with pytest.raises(ImportError):
                importlib.import_module(name)
    assert sys.modules["probe_withheld"] is top and sys.modules["probe_withheld.utils"] is sub
    assert log.read_text() == "imported\n"  # imported once, before the block


def test_a_withheld_import_fails_while_the_library_loads_and_is_recorded(
        house, triton_importable, tmp_path, monkeypatch):
    log = _probe_package(tmp_path, monkeypatch, "probe_optional")
    why = "TEST-ONLY: the kernels never read it"
    monkeypatch.setitem(kernel_only.WITHHELD, ("vllm-omni", "0.30.0"), {"probe_optional": why})
    loaded, _ = kernel_only.load(house, "vllm-omni", "0.30.0", vllm_omni_ops.LAYERS)
    assert loaded.withheld == {"probe_optional": why}
    assert loaded.record()["withheld"] == {"probe_optional": why}
    assert loaded.describe().endswith(f"; withheld: probe_optional ({why})")
    with loaded.active(full=True), pytest.raises(ImportError):  # as the library loads
        importlib.import_module("probe_optional")
    assert not log.exists()
    other, _ = kernel_only.load(house, "vllm-omni", "0.28.0", vllm_omni_ops.ATTENTION_OPS)
    assert other.withheld == {} and "withheld" not in other.record()  # a version not read


def test_a_call_does_not_withhold(house, triton_importable, tmp_path, monkeypatch):
    """Withholding walks sys.modules (milliseconds in a cell process): at load only, never
    around each call, whose time the timings would otherwise include."""
    monkeypatch.setitem(kernel_only.WITHHELD, ("vllm-omni", "0.30.0"), {"probe_call": "x"})
    loaded, _ = kernel_only.load(house, "vllm-omni", "0.30.0", vllm_omni_ops.LAYERS)
    entered = []
    real = kernel_only._withholding

    def spy(names):
        entered.append(names)
        return real(names)

    monkeypatch.setattr(kernel_only, "_withholding", spy)
    with loaded.active():
        pass
    assert entered == []
    with loaded.active(full=True):
        pass
    assert entered == [("probe_call",)]
