"""Every environment variable the package reads: its name, type, default, what it changes.

One table, :data:`SETTINGS`, and typed accessors over it. Each setting has a kind
(:class:`Kind`): a user setting, a fault-injection or test knob, a variable the runner sets
for its own child processes, or another tool's variable that this package reads or gives a
default. ``docs/settings.md`` is :func:`render_markdown`'s output
(``python -m gate_residual_matrix.settings > docs/settings.md``; a test keeps them equal).

This module imports nothing of the package, so every layer (the kernels included) may read
settings through it. A value that does not parse raises :class:`SettingError`, a
``ValueError`` whose message is one line naming the variable, the value and what is allowed;
the command line prints it as ``error: ...`` and exits 2. Reads are made when a value is
needed (a cell process sees its own environment), never cached.

Example::

    >>> from gate_residual_matrix import settings
    >>> settings.get("GATE_RESIDUAL_SHARDS", env={"GATE_RESIDUAL_SHARDS": "3"})
    3
    >>> settings.get("GATE_RESIDUAL_SHARDS", env={})  # unset: auto
    >>> try:
    ...     settings.get("GATE_RESIDUAL_PROGRESS", env={"GATE_RESIDUAL_PROGRESS": "bar"})
    ... except settings.SettingError as err:
    ...     print(err)
    GATE_RESIDUAL_PROGRESS='bar': expected one of auto, plain, off
"""

from __future__ import annotations

import enum
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SETTINGS", "Kind", "Setting", "SettingError", "get", "matching", "raw",
           "render_markdown", "setdefault"]


class Kind(enum.Enum):
    """Who a setting is for; ``docs/settings.md`` has one table per kind."""

    USER = "user"
    TEST = "test"
    INTERNAL = "internal"
    EXTERNAL = "external"


TITLES = {
    Kind.USER: "User settings",
    Kind.TEST: "Fault injection and test knobs",
    Kind.INTERNAL: "Set by the runner for its child processes",
    Kind.EXTERNAL: "Other tools' variables this package reads or gives a default",
}
"""The heading of each kind's table in ``docs/settings.md``."""


class SettingError(ValueError):
    """An environment variable with a value its setting does not accept (one line).

    ``exit_code`` is the command line's for bad input (2, as ``runner.errors.ConfigError``)."""

    exit_code = 2


class _Bad(Exception):
    """Raised by a parser: the value is not one it accepts."""


@dataclass(frozen=True)
class Setting:
    """One environment variable.

    ``type``: the values it takes, in words (the docs' "type" column). ``default``: what
    :func:`get` returns when it is unset (or empty, where ``empty_is_unset``);
    ``shown_default``: the docs' "default" column, where the default is worked out by the
    code that reads it (None: ``default`` as written). ``parse``: value -> typed value,
    raising :class:`_Bad` for a value it refuses; ``expected``: the allowed values, for the
    error message. A ``name`` ending in ``*`` is a prefix: :func:`matching` reads it.
    """

    name: str
    kind: Kind
    type: str
    default: Any
    help: str
    parse: Callable[[str], Any] = str
    expected: str = "any text"
    shown_default: str | None = None
    empty_is_unset: bool = True


def _flag(raw: str) -> bool:
    if raw not in ("0", "1"):
        raise _Bad
    return raw == "1"


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in choices:
            raise _Bad
        return raw
    return parse


def _whole(minimum: int, digits: int | None = None,
           auto: bool = False) -> Callable[[str], int | None]:
    """A whole number >= ``minimum`` in ASCII digits (at most ``digits``); ``auto`` -> None."""
    pattern = re.compile(f"[0-9]{{1,{digits}}}" if digits else "[0-9]+")

    def parse(raw: str) -> int | None:
        if auto and raw == "auto":
            return None
        if not pattern.fullmatch(raw) or int(raw) < minimum:
            raise _Bad
        return int(raw)
    return parse


def _python(kind: type) -> Callable[[str], Any]:
    """``int`` or ``float`` as Python parses them (spaces and signs allowed)."""
    def parse(raw: str) -> Any:
        try:
            return kind(raw)
        except ValueError:
            raise _Bad from None
    return parse


_OFF = ("off", "0", "no", "false")


def _path_or_off(raw: str) -> str:
    return "off" if raw.lower() in _OFF else raw


FAULTS = ("none", "raise", "hang", "oom", "kill", "illegal_address")
"""``GATE_RESIDUAL_FAULT``'s values (ops/gate_residual/faulty.py does what each says)."""
LAUNCH_METHODS = ("ctypes", "driver", "core")
"""``GATE_RESIDUAL_LAUNCH``'s values (kernels/launch.py)."""
FLAG = "1 or 0"
PATH = "a path"

_ALL = (
    # user settings
    Setting("GATE_RESIDUAL_SHARDS", Kind.USER, "positive integer or auto", None,
            "Processes per cell on the host backend (`--shards` sets it); auto: one per "
            "dtype group of a cuda cell, up to one per two CPUs and 8, one for a cpu cell.",
            _whole(1, digits=6, auto=True), "a positive integer (at most 6 digits) or 'auto'",
            shown_default="auto", empty_is_unset=False),
    Setting("GATE_RESIDUAL_PROGRESS", Kind.USER, "auto, plain or off", "auto",
            "How the runner shows a cell's progress: auto (a bar on a terminal, else one "
            "line per case), plain (one line per case), off.",
            _choice("auto", "plain", "off"), "one of auto, plain, off"),
    Setting("GATE_RESIDUAL_PRECOMPILE", Kind.USER, "whole number or auto", None,
            "Worker processes that fill torch.compile's caches before a cell runs; 0: none "
            "(the cell compiles everything itself); auto: one per spare CPU, at most the "
            "number of graphs.",
            _whole(0, auto=True), "a whole number >= 0 or 'auto'", shown_default="auto"),
    Setting("GATE_RESIDUAL_CUBIN_CACHE", Kind.USER, "path or off", None,
            "Folder of the on-disk cache of our kernels' cubins; off (or 0, no, false): no "
            "cache, every process compiles its kernels.",
            _path_or_off, "a path or off",
            shown_default="`$XDG_CACHE_HOME/gate-residual/cubin`"),
    Setting("GATE_RESIDUAL_GPU_LOCK", Kind.USER, "path", None,
            "Lock file that the cell processes on one GPU share, so that their timing "
            "loops run with the GPU to themselves (a sharded cell sets one in its reports "
            "folder).", expected=PATH, shown_default="none"),
    Setting("GATE_RESIDUAL_INPUT_CACHE", Kind.USER, "path", None,
            "Folder where the cell processes of one host share the values of large inputs "
            "(built once, read by the other modes and dtypes); unset: each process builds "
            "its own (the GPU host's script sets build/inputs).", expected=PATH,
            shown_default="none"),
    Setting("GATE_RESIDUAL_WHEELHOUSE", Kind.USER, "path", None,
            "Root of the kernel wheelhouse (library versions not installed in the "
            "environment); relative paths are from the project root.", expected=PATH,
            shown_default="matrix `libraries.wheelhouse`, else `.carry/kernel-wheelhouse`"),
    Setting("GATE_RESIDUAL_RL_KERNEL", Kind.USER, "path", None,
            "RL-Kernel's source tree; relative paths are from the project root.",
            expected=PATH,
            shown_default=("matrix `libraries.rl_kernel`, else `.carry/rl-kernel-h3`, "
                           "else `../shared/third_party/rl-kernel-h3`")),
    Setting("GATE_RESIDUAL_COMMIT", Kind.USER, "text", None,
            "The project commit that reports and tables name, instead of git's HEAD (the "
            "docker backend sets it in a container; `scripts/h200.sh --stamp` after checking "
            "the source files).", shown_default="git HEAD"),
    Setting("GATE_RESIDUAL_DIRTY", Kind.USER, FLAG, False,
            "With `GATE_RESIDUAL_COMMIT`: 1 records the checkout as dirty.", _flag, FLAG,
            shown_default="0"),
    Setting("GATE_RESIDUAL_DEBUG", Kind.USER, FLAG, False,
            "1: an internal error of the command line shows its traceback, not one line.",
            _flag, FLAG, shown_default="0"),
    Setting("GATE_RESIDUAL_CPROFILE", Kind.USER, "path", None,
            "Folder where each cell process writes `<cell>-<pid>.prof` (cProfile) of its run.",
            expected=PATH, shown_default="none"),
    Setting("GATE_RESIDUAL_LAUNCH", Kind.USER, ", ".join(LAUNCH_METHODS), "ctypes",
            "How our kernels are launched: libcuda's cuLaunchKernel through ctypes, the same "
            "through cuda.bindings (driver), or cuda.core.launch (core), for comparison.",
            _choice(*LAUNCH_METHODS), f"one of {', '.join(LAUNCH_METHODS)}",
            empty_is_unset=False),
    Setting("GATE_RESIDUAL_NO_SETUP", Kind.USER, FLAG, False,
            "1: `nox -s tests` skips installing Docker and Chromium (their tests then fail "
            "where those are missing).", _flag, FLAG, shown_default="0"),
    # fault injection and test knobs
    Setting("GATE_RESIDUAL_FAULTS", Kind.TEST, FLAG, False,
            "1: registers gate_residual's test-only implementations (`fault` and the other "
            "fault injectors).", _flag, FLAG, shown_default="0"),
    Setting("GATE_RESIDUAL_FAULT", Kind.TEST, ", ".join(FAULTS), "none",
            "What the `fault` implementation does at each call (a mode's `env` sets it).",
            _choice(*FAULTS), f"one of {', '.join(FAULTS)}"),
    Setting("GATE_RESIDUAL_FAULT_OOM_MB", Kind.TEST, "whole number >= 1", 512,
            "MiB that `GATE_RESIDUAL_FAULT=oom` may allocate before the allocator is made to "
            "fail.", _whole(1), "a whole number of MiB >= 1", empty_is_unset=False),
    Setting("GATE_RESIDUAL_FAULT_KILL_ROWS", Kind.TEST, "whole number", None,
            "`fault` sends SIGKILL to its own process at its first call with this many rows "
            "(set in the runner's environment: the cell's fingerprint stays the same).",
            _whole(0), "a whole number of rows", shown_default="none"),
    Setting("GATE_RESIDUAL_FAULT_HANG_ROWS", Kind.TEST, "whole number", None,
            "As `GATE_RESIDUAL_FAULT_KILL_ROWS`, but the call sleeps forever.",
            _whole(0), "a whole number of rows", shown_default="none"),
    Setting("GATE_RESIDUAL_TEST_SEED", Kind.TEST, "integer", None,
            "Seed of the tests' random inputs (tests/conftest.py).", _python(int),
            "an integer", shown_default="a new one per run"),
    Setting("GATE_RESIDUAL_WHEEL_CACHE", Kind.TEST, "path", None,
            "Where tests/test_kernel_only.py keeps the library wheels it downloads.",
            expected=PATH, shown_default="`~/.cache/gate-residual-matrix/wheels`"),
    # set by the runner for its children
    Setting("GATE_RESIDUAL_CELL_DEADLINE", Kind.INTERNAL, "seconds since the epoch", None,
            "A cell process exits by itself (code 124) after this time; a bad value is "
            "ignored.", _python(float), "seconds since the epoch", shown_default="none"),
    Setting("GATE_RESIDUAL_GPU_BUDGET_MIB", Kind.INTERNAL, "MiB", None,
            "The GPU memory the cell processes sharing `GATE_RESIDUAL_GPU_LOCK` may hold "
            "together, shared out case by case in a ledger beside the lock (set by the GPU "
            "host's queue); a bad value is ignored (no ledger).", _whole(1, 9),
            "a whole number of MiB >= 1",
            shown_default="none"),
    Setting("GATE_RESIDUAL_PARENT_PID", Kind.INTERNAL, "process id", None,
            "The runner's pid: a cell process exits (code 129) once its parent is another "
            "process; a bad value is ignored.", _python(int), "a process id",
            shown_default="none"),
    # other tools' variables
    Setting("XDG_CACHE_HOME", Kind.EXTERNAL, "path", None,
            "Parent of the cubin cache's default folder.", expected=PATH,
            shown_default="`~/.cache`"),
    Setting("CUDA_HOME", Kind.EXTERNAL, "path", None,
            "Where nvcc is looked for first (`$CUDA_HOME/bin/nvcc`), for RL-Kernel's "
            "extension build.", expected=PATH, shown_default="none"),
    Setting("CUDA_PATH", Kind.EXTERNAL, "path", None,
            "As `CUDA_HOME`, where that is unset.", expected=PATH, shown_default="none"),
    Setting("RLK_BUILD_DIR", Kind.EXTERNAL, "path", "/tmp/gate-residual-rl-kernel-build",
            "RL-Kernel's extension build cache; set to the default when unset, so that the "
            "cells of one run build it once.", expected=PATH),
    Setting("CC", Kind.EXTERNAL, "command", None,
            "The C compiler Triton builds its launchers with; without it, cc, gcc or clang "
            "must be on PATH for torch.compile on cuda.", expected="a command",
            shown_default="cc, gcc or clang"),
    Setting("CXX", Kind.EXTERNAL, "command", None,
            "The C++ compiler inductor uses for CPU code; without it, g++, c++ or clang++ "
            "must be on PATH for torch.compile on cpu.", expected="a command",
            shown_default="g++, c++ or clang++"),
    Setting("PYTHONPATH", Kind.EXTERNAL, "paths", None,
            "Python's module path; on a GPU host the wrapper (scripts/gpu_host.sh) puts the "
            "carried wheels and the copy's root on it, and the env step shows it.",
            expected=PATH, shown_default="none"),
    Setting("PYTHONPYCACHEPREFIX", Kind.EXTERNAL, "path", None,
            "Where Python writes and reads bytecode; on a GPU host the wrapper "
            "(scripts/gpu_host.sh) sets build/pycache and lifts PYTHONDONTWRITEBYTECODE, so "
            "that no process compiles torch's modules from source again.", expected=PATH,
            shown_default="beside each module"),
    Setting("UV", Kind.EXTERNAL, "command", None,
            "The uv binary nox looks for (read by nox); where none is found the noxfile tells "
            "nox so before it searches, since the sessions never use uv.", expected="a command",
            shown_default="uv on PATH"),
    Setting("TORCHINDUCTOR_CACHE_DIR", Kind.EXTERNAL, "path", None,
            "Inductor's cache (read by torch); the compile workers' stamps live in it.",
            expected=PATH, shown_default="torch's (`/tmp/torchinductor_<user>`)"),
    Setting("TORCHINDUCTOR_COMPILE_THREADS", Kind.EXTERNAL, "whole number", None,
            "Inductor's compile threads (read by torch); the compile workers default it to 1.",
            expected="a whole number", shown_default="torch's"),
    Setting("TRITON_CACHE_DIR", Kind.EXTERNAL, "path", None,
            "Triton's kernel cache (read by triton).", expected=PATH,
            shown_default="triton's (`~/.triton/cache`)"),
    Setting("OMP_NUM_THREADS", Kind.EXTERNAL, "whole number", None,
            "CPU threads of torch in a cell process; the shards of a cell default it to "
            "their share of the CPUs.", expected="a whole number", shown_default="torch's"),
    Setting("NUMBA_*", Kind.EXTERNAL, "numba's", None,
            "numba's own settings (`NUMBA_ENABLE_CUDASIM=1`: the CUDA simulator the tests "
            "use); every one but those of numba's CPU thread pool is part of the cubin "
            "cache's key.", shown_default="numba's"),
    Setting("PYTHONUNBUFFERED", Kind.EXTERNAL, "text", "1",
            "Python's: the runner sets it for cell processes and the compile workers default "
            "it to 1, so their output arrives line by line.", shown_default="1 (children)"),
    Setting("RAY_ADDRESS", Kind.EXTERNAL, "ray://HOST:PORT or HOST:PORT", None,
            "The cluster that `--cluster auto` connects to.",
            expected="ray://HOST:PORT or HOST:PORT", shown_default="none"),
    Setting("RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S", Kind.EXTERNAL, "seconds", 3,
            "Ray Client's first wait for its server; set to the default when unset.",
            expected="seconds"),
    Setting("RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S", Kind.EXTERNAL, "seconds", 3,
            "Ray Client's longest wait between tries; set to the default when unset.",
            expected="seconds"),
)

SETTINGS: dict[str, Setting] = {s.name: s for s in _ALL}
"""Every setting by name, in the order of the docs."""


def _declared(name: str) -> Setting:
    try:
        return SETTINGS[name]
    except KeyError:
        raise KeyError(f"{name} is not declared in gate_residual_matrix/settings.py") from None


def raw(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The unparsed value of declared setting ``name`` in ``env`` (default ``os.environ``),
    None when unset. Raises ``KeyError`` for an undeclared name."""
    _declared(name)
    return (os.environ if env is None else env).get(name)


def get(name: str, env: Mapping[str, str] | None = None, *, strict: bool = True) -> Any:
    """Setting ``name``'s value in ``env`` (default ``os.environ``), parsed; its default when
    unset (or empty, for most).

    Raises:
        SettingError: the value does not parse, e.g. ``GATE_RESIDUAL_PROGRESS='bar':
            expected one of auto, plain, off`` (with ``strict=False`` the default is
            returned instead).
        KeyError: ``name`` is not declared here (a defect, not a user's error).
    """
    setting = _declared(name)
    value = raw(name, env)
    if value is None or (value == "" and setting.empty_is_unset):
        return setting.default
    try:
        return setting.parse(value)
    except _Bad:
        if not strict:
            return setting.default
        raise SettingError(f"{name}={value!r}: expected {setting.expected}") from None


def setdefault(name: str) -> None:
    """Put setting ``name``'s default into ``os.environ`` where it is unset (for a library
    or a child process that reads it)."""
    os.environ.setdefault(name, str(_declared(name).default))


def matching(prefix: str, env: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """Every ``(name, value)`` of ``env`` (default ``os.environ``) whose name starts with
    ``prefix``, sorted; ``prefix + "*"`` must be declared (e.g. ``NUMBA_*``)."""
    _declared(prefix + "*")
    return sorted((k, v) for k, v in (os.environ if env is None else env).items()
                  if k.startswith(prefix))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown() -> str:
    """``docs/settings.md``: a table per kind (name, type, default, what it changes)."""
    lines = ["# Settings", "",
             "Every environment variable the package reads, from "
             "`gate_residual_matrix/settings.py`",
             "(this file is its rendering: `python -m gate_residual_matrix.settings > "
             "docs/settings.md`;",
             "tests/test_settings.py checks both, and that the code reads no other variable).",
             "A value a setting does not accept stops the command with one line naming the",
             "variable and the values allowed (exit 2).", ""]
    for kind, title in TITLES.items():
        lines += [f"## {title}", "", "| name | type | default | what it changes |",
                  "| --- | --- | --- | --- |"]
        for s in _ALL:
            if s.kind is kind:
                default = s.shown_default if s.shown_default is not None else f"`{s.default}`"
                lines.append(f"| `{s.name}` | {_cell(s.type)} | {_cell(default)} | "
                             f"{_cell(s.help)} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
