"""``python -m gate_residual_matrix gpu-host``: its options, checked before anything runs.

Examples::

    python -m gate_residual_matrix gpu-host --stamp              # here: .carry/source.json
    python -m gate_residual_matrix gpu-host --out OUT --timeout 540
    python -m gate_residual_matrix gpu-host --steps env,modes --matrix matrix.yaml \
        --mode plain --mode tf32 --jobs 2
    python -m gate_residual_matrix gpu-host --steps env,modes --target cpu --case 1 \
        --matrix matrix-rms-norm.yaml --mode plain              # a rehearsal on a CPU

Exit codes: 0 every step ok; 1 a step failed or was not run (``OUT/steps.json``); 2 a bad
option, or ``--stamp`` without git or with uncommitted changes (one line, nothing run);
130/143 interrupted (the step it stopped is recorded).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from gate_residual_matrix.runner.config.paths import PROJECT_ROOT, nonempty_path, output_folder
from gate_residual_matrix.runner.errors import ConfigError, StepsFailed

DEFAULT_OUT = Path("artifacts") / "gpu-host"
TARGETS = ("cuda", "cpu")


def add_parser(sub) -> argparse.ArgumentParser:
    """The ``gpu-host`` subcommand on ``sub`` (the command line's subparsers)."""
    from gate_residual_matrix.runner.gpu_host.procedure import DEFAULT_STEPS, STEPS

    p = sub.add_parser("gpu-host", help="everything this project runs on a GPU host: GPU "
                       "tests, every op's cells in several modes, the benchmark (README, On a "
                       "GPU machine)")
    p.add_argument("--stamp", action="store_true", help="here, on a clean checkout: record "
                   "HEAD and the source files' hashes in .carry/source.json, so that a copy's "
                   "reports name the commit; then exit")
    p.add_argument("--steps", help=f"comma-separated, run in this order: {', '.join(STEPS)} "
                   f"(default: {','.join(DEFAULT_STEPS)})")
    p.add_argument("--out", type=nonempty_path, default=DEFAULT_OUT, help="logs, steps.json, "
                   "reports/ and bench/ go here (default: %(default)s)")
    p.add_argument("--matrix", type=nonempty_path, action="append", help="a matrix file for "
                   "modes and bench (repeatable; default: every op's, runner/config/matrices.py)")
    p.add_argument("--mode", action="append", help="a mode of the modes step (repeatable; "
                   "default: every mode of the matrix files)")
    p.add_argument("--jobs", default="auto", help="cells run at once on the GPU, under its "
                   "lock, each taking a CPU per shard and its estimated GPU memory: a whole "
                   "number, or auto (as many as the CPUs and the GPU's memory hold on target "
                   "cuda, one on cpu; the default)")
    p.add_argument("--timeout", type=float, help="seconds for the whole run: a step running "
                   "then is stopped (a cell keeps its finished cases), later steps are not run")
    p.add_argument("--target", default="cuda", help="the cells' target: cuda (default) or cpu "
                   "(a rehearsal without a GPU)")
    p.add_argument("--case", action="append", help="only this case of the cells (repeatable)")
    return p


def _steps(text: str | None) -> tuple[str, ...]:
    from gate_residual_matrix.runner.gpu_host.procedure import DEFAULT_STEPS, STEPS

    if text is None:
        return DEFAULT_STEPS
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [s for s in names if s not in STEPS]
    if unknown or not names:
        got = repr(unknown[0]) if unknown else "nothing"
        raise ConfigError(f"--steps: expected step names from {', '.join(STEPS)}, got {got}")
    if len(set(names)) < len(names):
        raise ConfigError(f"--steps: a step is named twice in {text!r}")
    return names


def _modes(matrices: tuple[Path, ...], asked: list[str] | None) -> tuple[str, ...]:
    from gate_residual_matrix.runner.gpu_host.modes import load

    loaded = load(matrices)
    every = list(dict.fromkeys(m for mx in loaded.values() for m in mx.modes))
    if asked is None:
        return tuple(every)
    unknown = [m for m in asked if m not in every]
    if unknown:
        raise ConfigError(f"--mode: expected a mode of the matrix files ({', '.join(every)}), "
                          f"got {unknown[0]!r}")
    return tuple(dict.fromkeys(asked))


def _cases(matrices: tuple[Path, ...], asked: list[str] | None) -> tuple[str, ...] | None:
    """``--case`` values, each a case of at least one matrix file (None: every case).

    Raises:
        ConfigError: a case no file has (one line, the valid ones shortened).
    """
    from gate_residual_matrix.runner.gpu_host.modes import load
    from gate_residual_matrix.runner.plan.cells import choices_text

    if not asked:
        return None
    every = list(dict.fromkeys(c.id for mx in load(matrices).values() for c in mx.cases))
    unknown = [c for c in asked if c not in every]
    if unknown:
        raise ConfigError(f"--case: no matrix file has case {unknown[0]!r}; "
                          + choices_text("case", every))
    return tuple(dict.fromkeys(asked))


def _shards() -> None:
    """Check ``GATE_RESIDUAL_SHARDS`` before any step (the cells read it).

    Raises:
        ConfigError: it is neither ``auto`` nor a whole number >= 1 (one line).
    """
    from gate_residual_matrix.runner.backends import shards

    try:
        shards.requested()
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _jobs(text: str) -> int:
    """``--jobs``: ``auto`` is 0 (:func:`.modes.jobs_for` decides), else a whole number >= 1.

    Raises:
        ConfigError: anything else (one line).
    """
    if text.strip() == "auto":
        return 0
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        shown_text = text if len(text) <= 40 else text[:37] + "..."
        raise ConfigError(f"--jobs: expected auto or a whole number >= 1, got {shown_text!r}")
    return jobs


def host_run(args: argparse.Namespace):
    """The :class:`.steps.HostRun` the options ask for, and the steps.

    Raises:
        ConfigError: an unknown step, target, mode or case, a bad matrix file, a bad
            ``--jobs``, ``--timeout`` <= 0, an ``--out`` that cannot hold the results.
    """
    from gate_residual_matrix.runner.config.matrices import DEFAULT_MATRICES
    from gate_residual_matrix.runner.gpu_host.steps import HostRun

    steps = _steps(args.steps)
    jobs = _jobs(str(args.jobs))
    if args.timeout is not None and not 0 < args.timeout < float("inf"):
        raise ConfigError(f"--timeout: expected a number of seconds > 0, got {args.timeout:g}")
    if args.target not in TARGETS:
        raise ConfigError(f"--target: expected one of {', '.join(TARGETS)}, got {args.target!r}")
    output_folder(args.out, "--out")
    matrices = tuple(args.matrix or DEFAULT_MATRICES)
    modes = _modes(matrices, args.mode)
    cases = _cases(matrices, args.case)
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    _shards()
    try:  # last, so that a bad option makes nothing: an --out that cannot be made is one
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # too, not a failed step
        raise ConfigError(f"--out: cannot make the folder {args.out}: "
                          f"{err.strerror or type(err).__name__}") from None
    run = HostRun(out=args.out, root=PROJECT_ROOT, matrices=matrices, modes=modes,
                  target=args.target, cases=cases,
                  jobs=jobs, deadline=deadline)
    return run, steps


def run(args: argparse.Namespace) -> int:
    """``gpu-host``: ``--stamp``, or the steps (:func:`.steps.run_steps`); 0 when every
    step ended ok.

    Raises:
        ConfigError: a bad option (nothing run); :class:`.stamp.StampError` for ``--stamp``.
        StepsFailed: a step failed or was not run.
    """
    from gate_residual_matrix.runner.gpu_host import stamp
    from gate_residual_matrix.runner.gpu_host.procedure import STEPS
    from gate_residual_matrix.runner.gpu_host.steps import run_steps

    if args.stamp:
        if args.steps is not None:
            raise ConfigError("--stamp: records the source and exits; run the steps without it")
        written = stamp.write_stamp(PROJECT_ROOT)
        print(f"{stamp.STAMP}: commit {written['commit']}, {len(written['files'])} source "
              f"files, digest {written['digest']}")
        return 0
    host, names = host_run(args)
    host.source = stamp.apply_stamp(PROJECT_ROOT, os.environ)
    print(f"[gpu-host] source: {host.source['note']}", flush=True)
    results = run_steps(host, {name: STEPS[name] for name in names})
    bad = [r for r in results if not r.ok]
    print("[gpu-host] " + ", ".join(f"{r.name} {r.status}" for r in results)
          + f"; {host.out / 'steps.json'}", flush=True)
    if bad:
        raise StepsFailed(f"{len(bad)} of {len(results)} steps did not end ok: "
                          + ", ".join(f"{r.name} ({r.status}, rc {r.rc})" for r in bad)
                          + f"; logs in {host.out}")
    return 0
