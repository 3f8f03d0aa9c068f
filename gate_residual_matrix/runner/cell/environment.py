"""What a cell ran on: GPU, driver, CUDA, Python, library versions, this project's commit.

The fields are the reference report's ``environment`` (gpu, capability, torch, cuda, python,
tf32, libraries{...}, mode_environment{...}) plus numba, numba-cuda and numpy under
``libraries``, the GPU driver, the host name, the platform and ``project`` {commit, dirty}.
A library that is not installed is ``None``.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
from importlib import metadata
from pathlib import Path

import torch

#: Distribution names, as the reference report spells them, then ours.
LIBRARIES = (
    "torch", "triton", "diffusers", "vllm", "flashinfer-python", "sglang", "liger-kernel",
    "transformer_engine", "megatron-core", "numba", "numba-cuda", "numpy",
    # the library implementations' distributions (ops/<op>/libraries.py): vllm-omni,
    # SGLang's kernel wheels, RL-Kernel (pyproject name "RL-Kernel", import name rl_engine)
    "vllm-omni", "sglang-kernel", "sgl-kernel", "RL-Kernel",
)

PROJECT_ROOT = Path(__file__).resolve().parents[3]


def library_version(name: str) -> str | None:
    """Installed version of distribution ``name`` (``_``/``-`` insensitive), or None."""
    for candidate in (name, name.replace("_", "-"), name.replace("-", "_")):
        try:
            return metadata.version(candidate)
        except metadata.PackageNotFoundError:
            continue
    return None


def gpu_driver() -> str | None:
    """NVIDIA driver version from ``nvidia-smi``, or None where there is none."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        done = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else None


def project_state(root: Path = PROJECT_ROOT) -> dict:
    """{"commit": git HEAD or None, "dirty": True/False/None} of this project's checkout.

    ``dirty`` considers tracked files only, outside ``reports/`` (the runner's own output).
    Inside a container without git metadata, the values baked in at build time come from
    ``GATE_RESIDUAL_COMMIT`` / ``..._DIRTY``.
    """
    from gate_residual_matrix import settings

    if settings.get("GATE_RESIDUAL_COMMIT"):
        return {"commit": settings.get("GATE_RESIDUAL_COMMIT"),
                "dirty": settings.get("GATE_RESIDUAL_DIRTY")}
    git = shutil.which("git")
    if not git or not (root / ".git").exists():
        return {"commit": None, "dirty": None}
    try:
        head = subprocess.run([git, "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=30)
        status = subprocess.run([git, "-C", str(root), "status", "--porcelain",
                                 "--untracked-files=no", "--", ".", ":(exclude)reports"],
                                capture_output=True, text=True,
                                timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    commit = head.stdout.strip() if head.returncode == 0 else None
    return {"commit": commit, "dirty": bool(status.stdout.strip()) if commit else None}


def available_cpus() -> int | None:
    """CPUs this process may run on (its affinity mask, which a container's cpuset limits),
    or ``os.cpu_count()`` where the OS has no affinity call; None if neither says."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def load_average() -> float | None:
    """The host's 1-minute load average (runnable processes, ``os.getloadavg``), rounded to
    0.01, or None where the OS does not give one. CPU timings taken while it exceeds
    :func:`available_cpus` shared the cores with other work (docs/tables.md, Timings)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def capture(target: str, mode_environment: dict) -> dict:
    """The environment dict for a report (see module docstring).

    ``target`` "cuda" fills gpu/capability from device 0; "cpu" records the processor and
    torch's CPU capability instead. ``mode_environment`` is ``{mode: {VAR: value}}``.
    ``load_average.start`` is read here; the cell runner fills ``end`` when the cell ends.
    """
    env: dict = {
        "gpu": None,
        "capability": None,
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "libraries": {name: library_version(name) for name in LIBRARIES},
        "mode_environment": mode_environment,
        "driver": gpu_driver(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_threads": torch.get_num_threads(),
        "cpus_available": available_cpus(),
        "load_average": {"start": load_average(), "end": None},
        "project": project_state(),
    }
    if target == "cuda" and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["capability"] = list(torch.cuda.get_device_capability(0))
    return env


def uncommitted_digest(root: Path = PROJECT_ROOT) -> str | None:
    """sha256 hex of ``git diff HEAD --binary`` (the tracked files' uncommitted changes).

    None when the diff is empty, ``root`` is not a git checkout or git fails. Used in the
    fingerprint so that a dirty tree's reports are reused only while the changes are the same.
    """
    import hashlib

    git = shutil.which("git")
    if not git or not (root / ".git").exists():
        return None
    try:
        # reports/ is the runner's own output: a run must not change its own fingerprint
        diff = subprocess.run([git, "-C", str(root), "diff", "HEAD", "--binary", "--", ".",
                               ":(exclude)reports"],
                              capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if diff.returncode != 0 or not diff.stdout:
        return None
    return hashlib.sha256(diff.stdout).hexdigest()
