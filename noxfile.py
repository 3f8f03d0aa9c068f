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

Every session runs in one shared environment, ``.nox/env`` (:func:`env_python`): a virtualenv
that also sees the interpreter's own site-packages, so a GPU machine's existing torch is used
as is; where no torch is importable, ``torch==2.13.0`` is installed (the CPU wheel where the
machine's pip finds it). It holds the union of the extras the sessions asked for and is
reinstalled only when ``pyproject.toml`` changes or a session needs an extra it lacks, so a
second session starts in seconds and torch is installed once. ``--no-venv`` runs the sessions
with the ``python`` on PATH, ``--no-install`` installs nothing.

Sessions that call the runner end with its exit code (:data:`RUNNER_CODES`: 2 bad input, 3 a
report or table not written, 4 a backend cannot run, 5 a cell failed, 6 a verdict regressed
against a baseline, 130/143 signals), not
nox's 1 for every failure, so a script can tell them apart (:func:`run_runner`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import sys
import threading
import time
from pathlib import Path

import nox
import nox.command
import nox.virtualenv
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

TORCH_FALLBACK = "torch==2.13.0"
ENV = Path(".nox") / "env"
"""The one environment every session runs in."""
SESSION = {"venv_backend": "none"}
"""Sessions make no virtualenv of their own: :func:`env_python` gives them the shared one."""

if shutil.which(settings.raw("UV") or "uv") is None:
    # nox looks for uv on every run and logs "uv binary not found." when there is none; the
    # sessions never use uv (pip finds the machine's local torch wheel, uv would not), so
    # answer nox's lookup (its module attributes, which it reads before searching) up front.
    nox.virtualenv.HAS_UV, nox.virtualenv.UV = False, "uv"
    nox.virtualenv.UV_VERSION = nox.virtualenv.version.Version("0.0")
# On Ctrl-C nox waits this long for the runner (which got the SIGINT too) before it sends
# SIGTERM, then SIGKILL: time for the runner to kill the cell's process group, remove its
# container and staging directory (nox's defaults, 0.3 s and 0.2 s, can cut that short).
STOP = {"interrupt_timeout": 60.0, "terminate_timeout": 30.0}
# The runner's exit codes (runner/errors.py; README, "Exit codes").
RUNNER_CODES = {2: "bad matrix.yaml or option", 3: "a report or table could not be written",
                4: "a backend cannot run", 5: "a cell failed or was refused",
                6: "a verdict regressed against the baseline",
                130: "interrupted (SIGINT)", 143: "terminated (SIGTERM)"}


def run_runner(session: nox.Session, module: str, *args: str, extras: tuple[str, ...] = (),
               **kwargs) -> None:
    """``python -m module args`` in the shared environment (with ``extras``); nox then exits
    with the runner's own code.

    nox turns every failed command into a failed session and exits 1. When the command
    exits with one of :data:`RUNNER_CODES`, nox logged the failed command; this logs the
    session's result line with the code's meaning (``nox > Session matrix failed: exit
    code 2 (bad matrix.yaml or option)``) and ends nox with that code at once: sessions
    queued after it do not run, as with ``--stop-on-first-error``. Any other failure stays
    nox's (exit 1). Ctrl-C is nox's own 130.
    """
    try:
        session.run(env_python(session, *extras), "-m", module, *args, external=True,
                    **kwargs)
    except nox.command.CommandFailed as err:
        code = getattr(err, "return_code", None)  # nox >= 2025; before: "Returned code N"
        if code is None:
            found = re.fullmatch(r"Returned code (-?\d+)", str(err.reason or ""))
            code = int(found[1]) if found else None
        if code not in RUNNER_CODES:
            raise
        logger.error(f"Session {session.name} failed: exit code {code} ({RUNNER_CODES[code]}).")
        raise SystemExit(code) from None


HEARTBEAT_S = 15.0
"""While pip installs quietly, a line at least this often (seconds): pip ``-q`` prints nothing
while it unpacks torch, which takes tens of seconds on a small machine."""


def install(session: nox.Session, what: str, *command: str) -> None:
    """``session.run(*command)`` (a quiet pip install of ``what``) with a line every
    :data:`HEARTBEAT_S` seconds while it runs: ``nox > still installing torch==2.13.0 (30 s)``.
    Raises what ``session.run`` raises."""
    started, done = time.monotonic(), threading.Event()

    def beat() -> None:
        while not done.wait(HEARTBEAT_S):
            logger.info(f"still installing {what} ({time.monotonic() - started:.0f} s)")

    thread = threading.Thread(target=beat, name="install-heartbeat", daemon=True)
    thread.start()
    try:
        session.run(*command, external=True)
    finally:
        done.set()
        thread.join()


def _options(session: nox.Session):
    """nox's parsed command line (``--no-venv``, ``--no-install``); nox has no public accessor."""
    return session._runner.global_config


def _stamp() -> str:
    return hashlib.sha256(Path("pyproject.toml").read_bytes()).hexdigest()


def env_python(session: nox.Session, *extras: str) -> str:
    """The shared environment's interpreter, with this project (editable) and ``extras``
    installed, and torch unless the environment can already import one (its own, or the base
    interpreter's through ``--system-site-packages``).

    Made once with nox's own interpreter (``python -m venv``) and reinstalled only when
    ``pyproject.toml`` changed or ``extras`` are new to it: ``.nox/env/installed.json``
    records what it holds. ``--no-venv``: the ``python`` on PATH, nothing installed;
    ``--no-install``: the environment as it is (PATH's ``python`` when there is none).
    """
    options = _options(session)
    python = ENV / "bin" / "python"
    if getattr(options, "no_venv", False):
        return "python"
    if getattr(options, "no_install", False):
        return str(python) if python.exists() else "python"
    record = ENV / "installed.json"
    held = json.loads(record.read_text()) if record.exists() and python.exists() else {}
    wanted = sorted(set(extras) | set(held.get("extras", [])))
    if held.get("pyproject") == _stamp() and set(extras) <= set(held.get("extras", [])):
        return str(python)
    if not python.exists():
        session.run(sys.executable, "-m", "venv", "--system-site-packages", str(ENV),
                    external=True)
    found = session.run(str(python), "-c", "import importlib.util as u; "
                        "print(u.find_spec('torch') is not None)", silent=True, external=True)
    pip = (str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check")
    if not str(found or "").strip().endswith("True"):
        install(session, TORCH_FALLBACK, *pip, TORCH_FALLBACK)
    project = f".[{','.join(wanted)}]" if wanted else "."
    install(session, f"the project ({project})", *pip, "-e", project)
    record.write_text(json.dumps({"extras": wanted, "pyproject": _stamp()}) + "\n")
    return str(python)


@nox.session(**SESSION)
def matrix(session: nox.Session) -> None:
    """Run the matrix (docker stacks whose image exists, in containers), then the tables."""
    cluster = any(a == "--cluster" or a.startswith("--cluster=") for a in session.posargs)
    run_runner(session, "gate_residual_matrix.runner", "matrix", *session.posargs,
               extras=("docker", "report", *(["ray"] if cluster else [])), **STOP)


@nox.session(**SESSION)
def build(session: nox.Session) -> None:
    """Build the images of the docker stacks that are missing (posargs: --stack NAME ...)."""
    run_runner(session, "gate_residual_matrix.runner", "build", *session.posargs,
               extras=("docker",), **STOP)


@nox.session(**SESSION)
def base_image(session: nox.Session) -> None:
    """Make the local base image without a registry: debootstrap + docker import (root)."""
    run_runner(session, "gate_residual_matrix.runner", "base-image", *session.posargs,
               extras=("docker",))


@nox.session(**SESSION)
def report(session: nox.Session) -> None:
    """Render reports/README.md, index.html, summary.csv|json (filters: docs/tables.md)."""
    run_runner(session, "gate_residual_matrix.runner", "report", *session.posargs,
               extras=("report",))


@nox.session(**SESSION)
def compare(session: nox.Session) -> None:
    """The verdicts that changed from BASELINE_DIR to NEW_DIR (default reports/); exit 6 when
    one regressed (posargs: BASELINE_DIR [NEW_DIR] --rules FILE --allow RULE --fail RULE;
    docs/ci.md)."""
    run_runner(session, "gate_residual_matrix.runner", "compare", *session.posargs,
               extras=("report",))


@nox.session(**SESSION)
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
    session.run(env_python(session, "test"), "-m", "pytest", *session.posargs, external=True)


@nox.session(**SESSION)
def lint(session: nox.Session) -> None:
    """ruff over the project, then mypy over the modules pyproject.toml's [tool.mypy] lists."""
    python = env_python(session, "lint")
    session.run(python, "-m", "ruff", "check", ".", *session.posargs, external=True)
    session.run(python, "-m", "mypy", external=True)


@nox.session(**SESSION)
def bench(session: nox.Session) -> None:
    """Benchmark (GPU: CUDA events, medians, copy bandwidth); writes reports/bench/*.json."""
    run_runner(session, "gate_residual_matrix.bench", *session.posargs)


@nox.session
def kernel_wheelhouse(session: nox.Session) -> None:
    """The kernel wheelhouse (runner/wheelhouse.py): needs a package index.

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
