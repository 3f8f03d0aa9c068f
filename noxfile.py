"""Nox sessions: thin wrappers over ``python -m gate_residual_matrix``; the logic lives in the
package.

    nox -s matrix                       # every cell this host can run, then the tables
    nox -s matrix -- --target cpu --case 257
    nox -s matrix -- --cluster ray://HEAD:10001 --gpu-model "NVIDIA H200"   # docs/cluster.md
    nox -s matrix -- --build --stack cpu-torch2.13   # builds a missing image first (else skipped)
    nox -s build -- --stack cpu-torch2.13   # the images of the docker stacks (all by default)
    nox -s base_image                   # root: the local base image (debootstrap + import)
    nox -s report                       # reports/README.md from every report
    nox -s compare -- BASELINE_DIR [NEW_DIR]   # verdicts that changed; exit 6 when one regressed
    nox -s matrix -- --expect reports/ --target cpu   # run, then compare (docs/ci.md)
    nox -s tests                        # the test suite (no GPU needed)
    nox -s lint

Sessions install this project into a virtualenv that also sees the interpreter's own
site-packages, so a GPU machine's existing torch is used as is; where no torch is importable,
``torch==2.13.0`` is installed (the CPU wheel where the machine's pip finds it).

Sessions that call the runner end with its exit code (:data:`RUNNER_CODES`: 2 bad input, 3 a
report or table not written, 4 a backend cannot run, 5 a cell failed, 6 a verdict regressed
against a baseline, 130/143 signals), not
nox's 1 for every failure, so a script can tell them apart (:func:`run_runner`).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import nox
import nox.command
from nox.logger import logger


def _load_settings():
    """The package's settings module (gate_residual_matrix/settings.py), loaded by its path:
    nox's own environment need not have the project installed, and the module imports
    nothing of the package."""
    name = "_gate_residual_matrix_settings"
    path = Path(__file__).resolve().parent / "gate_residual_matrix" / "settings.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


settings = _load_settings()
nox.options.sessions = ["tests"]
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True

VENV = ["--system-site-packages"]
TORCH_FALLBACK = "torch==2.13.0"
# On Ctrl-C nox waits this long for the runner (which got the SIGINT too) before it sends
# SIGTERM, then SIGKILL: time for the runner to kill the cell's process group, remove its
# container and staging directory (nox's defaults, 0.3 s and 0.2 s, can cut that short).
STOP = {"interrupt_timeout": 60.0, "terminate_timeout": 30.0}
# The runner's exit codes (runner/errors.py; README, "Exit codes").
RUNNER_CODES = {2: "bad matrix.yaml or option", 3: "a report or table could not be written",
                4: "a backend cannot run", 5: "a cell failed or was refused",
                6: "a verdict regressed against the baseline",
                130: "interrupted (SIGINT)", 143: "terminated (SIGTERM)"}


def run_runner(session: nox.Session, module: str, *args: str, **kwargs) -> None:
    """``python -m module args`` in the session; nox then exits with the runner's own code.

    nox turns every failed command into a failed session and exits 1. When the command
    exits with one of :data:`RUNNER_CODES`, nox logged the failed command; this logs the
    session's result line with the code's meaning (``nox > Session matrix failed: exit
    code 2 (bad matrix.yaml or option)``) and ends nox with that code at once: sessions
    queued after it do not run, as with ``--stop-on-first-error``. Any other failure stays
    nox's (exit 1). Ctrl-C is nox's own 130.
    """
    try:
        session.run("python", "-m", module, *args, **kwargs)
    except nox.command.CommandFailed as err:
        code = getattr(err, "return_code", None)  # nox >= 2025; before: "Returned code N"
        if code is None:
            found = re.fullmatch(r"Returned code (-?\d+)", str(err.reason or ""))
            code = int(found[1]) if found else None
        if code not in RUNNER_CODES:
            raise
        logger.error(f"Session {session.name} failed: exit code {code} ({RUNNER_CODES[code]}).")
        raise SystemExit(code) from None


def install_project(session: nox.Session, *extras: str) -> None:
    """This project (editable) with ``extras``, and torch unless the session's virtualenv can
    already import one (its own, or the base interpreter's through --system-site-packages).

    Asked of the session's interpreter, not nox's: nox may live in a virtualenv of its own
    whose torch the session does not see. Under ``--no-install`` nothing is asked or installed.
    """
    spec = f".[{','.join(extras)}]" if extras else "."
    found = session.run_install(
        "python", "-c", "import importlib.util as u; print(u.find_spec('torch') is not None)",
        silent=True)
    if found is not None and found.strip().splitlines()[-1:] != ["True"]:
        session.install(TORCH_FALLBACK)
    session.install("-e", spec)


@nox.session(venv_params=VENV)
def matrix(session: nox.Session) -> None:
    """Run the matrix (docker stacks whose image exists, in containers), then the tables."""
    cluster = any(a == "--cluster" or a.startswith("--cluster=") for a in session.posargs)
    install_project(session, "docker", "report", *(["ray"] if cluster else []))
    run_runner(session, "gate_residual_matrix.runner", "matrix", *session.posargs, **STOP)


@nox.session(venv_params=VENV)
def build(session: nox.Session) -> None:
    """Build the images of the docker stacks that are missing (posargs: --stack NAME ...)."""
    install_project(session, "docker")
    run_runner(session, "gate_residual_matrix.runner", "build", *session.posargs, **STOP)


@nox.session(venv_params=VENV)
def base_image(session: nox.Session) -> None:
    """Make the local base image without a registry: debootstrap + docker import (root)."""
    install_project(session, "docker")
    run_runner(session, "gate_residual_matrix.runner", "base-image", *session.posargs)


@nox.session(venv_params=VENV)
def report(session: nox.Session) -> None:
    """Render reports/README.md, index.html, summary.csv|json (filters: docs/tables.md)."""
    install_project(session, "report")
    run_runner(session, "gate_residual_matrix.runner", "report", *session.posargs)


@nox.session(venv_params=VENV)
def compare(session: nox.Session) -> None:
    """The verdicts that changed from BASELINE_DIR to NEW_DIR (default reports/); exit 6 when
    one regressed (posargs: BASELINE_DIR [NEW_DIR] --rules FILE --allow RULE --fail RULE;
    docs/ci.md)."""
    install_project(session, "report")
    run_runner(session, "gate_residual_matrix.runner", "compare", *session.posargs)


@nox.session(venv_params=VENV)
def tests(session: nox.Session) -> None:
    """The test suite: CPU path, CUDA simulator, PTX, runner, Docker, HTML in Chromium.

    First makes sure a Docker engine answers and Chromium is installed (both scripts are
    idempotent and need root or sudo; ``GATE_RESIDUAL_NO_SETUP=1`` skips them, and then the
    docker- and browser-marked tests fail where those are missing rather than skip).
    """
    try:
        no_setup = settings.get("GATE_RESIDUAL_NO_SETUP")
    except ValueError as err:  # settings.SettingError: one line naming the variable
        session.error(str(err))
    if not no_setup:
        session.run("bash", ".ci/install-docker.sh", external=True)
        session.run("bash", ".ci/install-chromium.sh", external=True)
    install_project(session, "test")
    session.run("python", "-m", "pytest", *session.posargs)


@nox.session(venv_params=VENV)
def lint(session: nox.Session) -> None:
    """ruff over the project, then mypy over the modules pyproject.toml's [tool.mypy] lists."""
    session.install("ruff>=0.6", "mypy>=1.10")
    session.run("ruff", "check", ".", *session.posargs)
    session.run("mypy")


@nox.session(venv_params=VENV)
def bench(session: nox.Session) -> None:
    """Benchmark (GPU: CUDA events, medians, copy bandwidth); writes reports/bench/*.json."""
    install_project(session)
    run_runner(session, "gate_residual_matrix.bench.gate_residual", *session.posargs)


@nox.session(venv_params=VENV)
def kernel_wheelhouse(session: nox.Session) -> None:
    """The kernel wheelhouse (issue 13; runner/wheelhouse.py): needs a package index.

    ``pip download --no-deps`` of each library version matrix.yaml's ``libraries.versions``
    names, keeping only the kernel modules, RECORD and a manifest, content-addressed, under
    ``libraries.wheelhouse`` (default ``.carry/kernel-wheelhouse``, git-ignored): about 1 MB to
    carry to an offline GPU host. Posargs go to ``python -m gate_residual_matrix.runner.wheelhouse``
    (--matrix,
    repeatable: the union of their versions; --out, --cache; --extensions: also vllm's compiled
    ``_C_stable_libtorch.abi3.so`` per version, 78-93 MB each, for the vllm_*_cuda rows).
    """
    session.install("pyyaml>=6")
    session.run("python", "-m", "gate_residual_matrix.runner.wheelhouse", *session.posargs)
