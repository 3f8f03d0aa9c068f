"""The step runner: named steps one after another, each with its own log, none stopping another.

A step is a function ``step(run) -> int`` (0: ok) of a :class:`HostRun`. :func:`run_steps`
calls each in turn with its output (Python's and its child processes', file descriptors 1
and 2) in ``OUT/<step>.log``, prints the log's last lines, and records every step in
``OUT/steps.json`` (rewritten after each step, so a run cut short still says what it did):

    {"schema_version": 1, "options": {...}, "source": {...},
     "steps": [{"name": "env", "status": "ok", "rc": 0, "wall_s": 1.2, "log": "env.log"}, ...]}

``status`` is ``ok`` (rc 0), ``failed`` (another rc; a step that raised is rc 1 with the
traceback in its log), ``timeout`` (rc 124: the run's ``--timeout`` came while it ran),
``not run`` (rc null: no time left when its turn came) or ``interrupted`` (SIGINT, SIGTERM:
rc 128 + the signal; the steps after it are not run and the interruption goes on).

Example::

    >>> run = HostRun(out=Path("/tmp/gpu-host-doc"))
    >>> [r.status for r in run_steps(run, {"hello": lambda run: print("hi") or 0})]
    ['ok']
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gate_residual_matrix.runner.untrusted.files import write_text_atomic

SCHEMA_VERSION = 1
TIMEOUT_RC = 124
"""A step stopped at the run's deadline (as timeout(1) exits)."""
TAIL_LINES = 12
"""How many of a step's last log lines are printed after it."""
GRACE_S = 10.0
"""Between SIGTERM and SIGKILL for a child process stopped at the deadline."""


@dataclass
class HostRun:
    """What every step of one run shares: the output folder, the options, the deadline.

    ``deadline``: ``time.monotonic()`` by which every step must have ended (None: none).
    ``jobs``: cells at once in the modes step (0: as many as the CPUs hold,
    :func:`.modes.jobs_for`).
    ``source``: what the source stamp said (:func:`.stamp.apply_stamp`). A step that sets a
    variable for the steps after it (the smoke step's launch path) sets it in
    ``os.environ``, which every child inherits.
    """

    out: Path
    root: Path = Path(".")
    matrices: tuple[Path, ...] = ()
    modes: tuple[str, ...] = ()
    target: str = "cuda"
    cases: tuple[str, ...] | None = None
    jobs: int = 1
    deadline: float | None = None
    source: dict = field(default_factory=dict)

    def options(self) -> dict:
        """The options as steps.json records them."""
        return {"matrices": [str(p) for p in self.matrices], "modes": list(self.modes),
                "target": self.target, "cases": None if self.cases is None else list(self.cases),
                "jobs": self.jobs or "auto"}

    def left(self) -> float | None:
        """Seconds until the deadline (negative once past), or None without one."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def child(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> int:
        """Run ``argv`` in the project's root, its output in the step's log; its exit code
        (:meth:`start`, then :meth:`finish`)."""
        return self.finish(self.start(argv, env=env))

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              ) -> subprocess.Popen:
        """Start ``argv`` in the project's root, in its own session (its process group is
        stopped with it), with this process's environment and ``env`` over it; its output
        goes where this process's goes (the step's log)."""
        sys.stdout.flush()
        sys.stderr.flush()
        return subprocess.Popen(list(argv), cwd=self.root, env={**os.environ, **(env or {})},
                                stdin=subprocess.DEVNULL, start_new_session=True)

    def finish(self, proc: subprocess.Popen) -> int:
        """Wait for ``proc`` until the deadline; its exit code, or :data:`TIMEOUT_RC` when
        the deadline came first (SIGTERM to its group, SIGKILL after :data:`GRACE_S`). An
        interruption here kills its group before it goes on."""
        try:
            left = self.left()
            try:
                return proc.wait(timeout=None if left is None else max(left, 0.0))
            except subprocess.TimeoutExpired:
                print(f"[gpu-host] stopped at the deadline: {' '.join(map(str, proc.args))}",
                      flush=True)
                _signal_group(proc, signal.SIGTERM)
                try:
                    proc.wait(timeout=GRACE_S)
                except subprocess.TimeoutExpired:
                    _signal_group(proc, signal.SIGKILL)
                    proc.wait()
                return TIMEOUT_RC
        except BaseException:  # Ctrl-C, SIGTERM: no child outlives the run
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
            raise


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    """Send ``signum`` to ``proc``'s process group (its own session), if it is still there."""
    if proc.pid <= 0:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)


@dataclass(frozen=True)
class StepResult:
    """One step's record in ``steps.json``."""

    name: str
    status: str
    rc: int | None
    wall_s: float
    log: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@contextlib.contextmanager
def captured(log: Path) -> Iterator[None]:
    """File descriptors 1 and 2, ``sys.stdout`` and ``sys.stderr`` into ``log`` (appended),
    for this process and the children it starts, until the block ends."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    text = open(os.dup(fd), "w", encoding="utf-8", errors="replace", buffering=1)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            yield
    finally:
        text.flush()
        text.close()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for d in (fd, *saved):
            os.close(d)


def tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of ``path`` (none when it cannot be read)."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def _status(rc: int | None) -> str:
    if rc is None:
        return "not run"
    return "ok" if rc == 0 else "timeout" if rc == TIMEOUT_RC else "failed"


def write_record(run: HostRun, results: Sequence[StepResult]) -> Path:
    """``OUT/steps.json`` (see the module docstring), replaced whole."""
    path = run.out / "steps.json"
    write_text_atomic(path, json.dumps({
        "schema_version": SCHEMA_VERSION, "options": run.options(), "source": run.source,
        "steps": [asdict(r) for r in results]}, indent=2) + "\n")
    return path


def run_steps(run: HostRun, steps: Mapping[str, Callable[[HostRun], int]]) -> list[StepResult]:
    """Run ``steps`` in order (see the module docstring); their results.

    Raises whatever interrupted the run (``KeyboardInterrupt``, :class:`runner.errors.
    Interrupted`) after recording the step it stopped as ``interrupted``.
    """
    run.out.mkdir(parents=True, exist_ok=True)
    results: list[StepResult] = []
    for name, step in steps.items():
        log = run.out / f"{name}.log"
        left = run.left()
        if left is not None and left <= 0:
            results.append(StepResult(name, "not run", None, 0.0, log.name))
            print(f"[gpu-host] {name}: not run: the run's --timeout has passed", flush=True)
            write_record(run, results)
            continue
        print(f"[gpu-host] === {name}", flush=True)
        log.write_text("", encoding="utf-8")
        started = time.monotonic()
        rc: int | None
        try:
            with captured(log):
                try:
                    rc = int(step(run) or 0)
                except Exception:  # a step's defect costs that step only
                    traceback.print_exc()
                    rc = 1
        except KeyboardInterrupt as stop:
            code = getattr(stop, "exit_code", 128 + signal.SIGINT)
            results.append(StepResult(name, "interrupted", code,
                                      round(time.monotonic() - started, 3), log.name))
            write_record(run, results)
            raise
        result = StepResult(name, _status(rc), rc, round(time.monotonic() - started, 3),
                            log.name)
        results.append(result)
        write_record(run, results)
        for line in tail(log):
            print(f"  {line}")
        print(f"[gpu-host] {name}: {result.status} (rc {rc}) in {result.wall_s:.1f} s; "
              f"log {run.out / log.name}", flush=True)
    return results
