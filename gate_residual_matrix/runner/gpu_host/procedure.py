"""The GPU-host steps, in the order a full run takes them (:data:`STEPS`).

Each is ``step(run: HostRun) -> int`` (0: ok), its output in ``OUT/<step>.log``
(:mod:`.steps`). Steps that run code on the GPU do it in child processes (:meth:`HostRun.
child`): the runner itself never holds a CUDA context, and a crash or a hang costs one step.

* ``env``: the GPU (``nvidia-smi``), Python and the versions of torch, triton, numba,
  numba-cuda and numpy, the caches and the source stamp;
* ``smoke``: our kernel once through the default launch path (cuLaunchKernel); when that
  fails, ``GATE_RESIDUAL_LAUNCH=core`` for every later step (and the step fails);
* ``tests``: the GPU tests (``pytest -m gpu`` over the test files that mark tests ``gpu``);
* ``sass``: registers, shared and local memory and FMA count of every kernel
  (``scripts/sass_report.py``);
* ``rlbuild``: RL-Kernel's extension built from its source tree (:mod:`.probes`);
* ``libsmoke``: every library row of ``matrix.yaml`` called once (``scripts/library_smoke.py``);
* ``modes``: the cells of every ``--matrix`` in every ``--mode`` (:mod:`.modes`);
* ``bench``: the benchmark of the selected matrices' ops (``python -m gate_residual_matrix.bench
  --op OP ...``, into ``OUT/bench``);
* ``profile``: the host time of one small call (``scripts/profile_host.py``).
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from gate_residual_matrix import settings
from gate_residual_matrix.runner.gpu_host import modes as modes_step
from gate_residual_matrix.runner.gpu_host.steps import HostRun

PROBES = "gate_residual_matrix.runner.gpu_host.probes"
VERSIONS = ("torch", "triton", "numba", "numba-cuda", "numpy", "pydantic", "jsonschema")
CACHES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "RLK_BUILD_DIR",
          "GATE_RESIDUAL_CUBIN_CACHE", "GATE_RESIDUAL_INPUT_CACHE", "GATE_RESIDUAL_LAUNCH",
          "PYTHONPYCACHEPREFIX", "PYTHONPATH")
GPU_QUERY = "name,driver_version,memory.total,clocks.sm,clocks.mem"


def env(run: HostRun) -> int:
    """What this host is: the GPU, Python, the libraries, the caches, the source stamp.
    Fails when a cuda run finds no ``nvidia-smi`` or it fails, or torch does not import."""
    from gate_residual_matrix.runner.cell.environment import available_cpus, library_version

    rc = 0
    exe = shutil.which("nvidia-smi")
    if exe is None:
        print("nvidia-smi: not on PATH")
        rc = 1 if run.target == "cuda" else 0
    else:
        rc = run.child([exe, f"--query-gpu={GPU_QUERY}", "--format=csv"])
    print(f"python {platform.python_version()} ({sys.executable}); {available_cpus()} CPUs")
    print(", ".join(f"{name} {library_version(name)}" for name in VERSIONS))
    try:
        import torch

        print(f"torch CUDA {torch.version.cuda}; GPU visible: {torch.cuda.is_available()}")
    except ImportError as err:
        print(f"torch does not import: {err}")
        rc = 1
    for var in CACHES:
        print(f"{var}={settings.raw(var) or ''}")
    print(f"source: {run.source.get('note', 'not checked')}")
    return rc


def smoke(run: HostRun) -> int:
    """Our kernel through the default launch path; on failure the rest of the run uses
    ``cuda.core``'s launch (``GATE_RESIDUAL_LAUNCH=core``)."""
    rc = run.child([sys.executable, "-m", PROBES, "launch"])
    if rc == 0:
        return 0
    os.environ["GATE_RESIDUAL_LAUNCH"] = "core"
    print(f"cuLaunchKernel path failed (exit {rc}): GATE_RESIDUAL_LAUNCH=core from here on")
    core = run.child([sys.executable, "-m", PROBES, "launch"])
    print("cuda.core launch path: " + ("ok" if core == 0 else f"failed too (exit {core})"))
    return 1


def gpu_test_files(root: Path) -> list[str]:
    """The test files that mark tests ``gpu`` (``pytest.mark.gpu``), relative to ``root``."""
    return sorted(p.relative_to(root).as_posix() for p in (root / "tests").glob("test_*.py")
                  if "pytest.mark.gpu" in p.read_text(encoding="utf-8", errors="replace"))


def tests(run: HostRun) -> int:
    """The GPU tests (``pytest -m gpu``)."""
    files = gpu_test_files(run.root)
    print(f"{len(files)} test files with GPU tests: {' '.join(files)}", flush=True)
    return run.child([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p",
                      "no:cacheprovider", *files])


def sass(run: HostRun) -> int:
    """Registers, memory and FMA count of every kernel, from the SASS."""
    return run.child([sys.executable, "scripts/sass_report.py"])


def rlbuild(run: HostRun) -> int:
    """RL-Kernel's extension, built once into ``$RLK_BUILD_DIR``."""
    return run.child([sys.executable, "-m", PROBES, "rlbuild"])


def libsmoke(run: HostRun) -> int:
    """Every library row of ``matrix.yaml`` called once on a tiny input."""
    return run.child([sys.executable, "scripts/library_smoke.py"])


def modes(run: HostRun) -> int:
    """The cells of every ``--matrix`` in every ``--mode`` (:func:`.modes.run_modes`)."""
    return modes_step.run_modes(run)


def bench(run: HostRun) -> int:
    """The benchmark of every selected matrix's op, into ``OUT/bench``."""
    ops = modes_step.ops_of(run.matrices)
    return run.child([sys.executable, "-m", "gate_residual_matrix.bench",
                      *(a for op in ops for a in ("--op", op)), "--out", str(run.out / "bench")])


def profile(run: HostRun) -> int:
    """Where the host time of one small call goes (N = 1)."""
    return run.child([sys.executable, "scripts/profile_host.py", "1"])


STEPS: dict[str, Callable[[HostRun], int]] = {
    "env": env, "smoke": smoke, "tests": tests, "sass": sass, "rlbuild": rlbuild,
    "libsmoke": libsmoke, "modes": modes, "bench": bench, "profile": profile}
"""Every step, in the order a run takes them."""

DEFAULT_STEPS = ("env", "smoke", "tests", "sass", "libsmoke", "modes", "bench", "profile")
"""A run without ``--steps``: everything (``modes`` builds RL-Kernel's extension itself)."""
