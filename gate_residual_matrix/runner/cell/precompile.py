"""Compile ahead, in parallel: shape-specialising implementations get their graphs built by
worker processes before a cell's cases run.

``torch.compile(..., dynamic=False)`` (``compiled``, ``compiled_emulate``) compiles one
program per input shape and dtype: a default ``cuda`` cell calls each with about 35 row
counts in 6 dtype pairs (the cases and :func:`runner.cell.batch_invariance.row_counts`), forward
with and without autograd, about 800 graphs, which one process compiles one after another
(129 s of a 420 s partial run on the H200, 2026-12-01). Compilation is deterministic and
inductor keeps what it compiles in its on-disk caches (FX graph, AOTAutograd and Triton
caches, keyed by the graph, the shapes, the settings and the versions), so worker processes
started with the cell's environment and torch settings compile the same programs into the
same cache, in parallel, and the cell then loads them: the code under test is the one it
would have compiled itself.

An implementation with a ``run_dynamic`` (the ``torch.compile`` rows) runs the batch-invariance
checks on one graph with N dynamic: the plan lists that graph once per dtype pair (and its
N = 1 graph, which dynamo specialises) instead of one static graph per size they call.

The workers run before the first case and are waited for (bounded by ``timeout_s``), so no
compilation competes with the cell's timing loops. A worker that fails costs only time: the
cell compiles what is missing itself. ``environment.precompile`` in the report records what
was done.

The workers (:mod:`runner.cell.compile_pool`) are started as::

    python -m gate_residual_matrix.runner.cell.compile_pool PLAN.json

``GATE_RESIDUAL_PRECOMPILE=0`` turns it off (the cell then compiles everything itself);
``=N`` asks for N workers.

**Once per cache, for every mode at once.** Workers that only find their graphs in the
cache still cost a cell 25-40 s (starting, importing torch, tracing each call; measured on
the H200, 2026-12-01). A finished precompile without failures leaves a *stamp* in inductor's
cache folder, keyed by everything that decides the graphs (:func:`stamp_key`); a cell whose
stamp is there skips its workers and loads the graphs itself (``environment.precompile``
says ``"stamp"``). Deleting inductor's cache deletes the stamps with it; a graph missing
despite a stamp is compiled by the cell itself, so a stamp can cost time but never bits.
Before several cells of one host (the H200's six modes), one command fills the cache for
all of them in one pool of workers, each with its mode's variables and torch settings::

    python -m gate_residual_matrix.runner.cell.precompile --matrix matrix.yaml --target cuda \
        --mode plain --mode tf32
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gate_residual_matrix import settings
from gate_residual_matrix.runner.cell.batch_invariance import checked_row_counts, sweep_row_counts
from gate_residual_matrix.runner.cell.compile_pool import TIMEOUT_S, run, run_groups

__all__ = ["MAX_WORKERS", "TIMEOUT_S", "ModePlan", "cell_plan", "leave_stamp", "load_only",
           "mode_plans", "plan", "precompile_modes", "run", "run_groups", "stamp_key",
           "stamp_path", "stamped", "workers_for"]

MAX_WORKERS = 12

def plan(matrix, cases, impls, *, target: str, inference: bool) -> list[dict]:
    """The calls that compile every graph the cell will need, in the cases' order:
    ``{"impl", "dtype", "index_dtype", "rows", "grad"}`` with ``grad`` one of ``train``
    (forward + backward), ``no_grad`` (the timing loop's forward) or ``inference``
    (under ``torch.inference_mode()``: an inference cell's runs and timings), and
    ``"graph": "dynamic"`` for a call through the implementation's ``run_dynamic`` (the
    batch-invariance checks' graph with N dynamic: one call per dtype pair at the first
    sweep's top size, where the cell first compiles it, and one at N = 1). ``impls``: those
    that compile per shape (every row count a case calls them with), or per dtype pair into
    a kernel cache (``cached_kernels``: one call per case size, as the cell's first call of
    a case makes it)."""
    items, seen = [], set()
    for case in cases:
        dtype, index_dtype = matrix.case_dtypes(case)
        for impl in impls:
            for rows, grad, graph in _calls(matrix, case, impl, inference):
                # every N >= 2 shares one dynamic graph: the first such call builds it
                shape = "N" if graph == "dynamic" and rows >= 2 else rows
                key = (impl.name, dtype, index_dtype, shape, grad, graph)
                if key not in seen:
                    seen.add(key)
                    items.append({"impl": impl.name, "dtype": dtype, "index_dtype": index_dtype,
                                  "rows": rows, "grad": grad,
                                  **({"graph": graph} if graph == "dynamic" else {})})
    return items


def _calls(matrix, case, impl, inference: bool) -> list[tuple[int, str, str]]:
    """``(rows, grad, graph)`` of the calls a case makes of ``impl`` that compile (see
    :func:`plan`), ``graph`` "static" or "dynamic"."""
    if not impl.compiles_per_shape:
        return [(case.n, "inference" if inference else "train", "static")]
    if inference:  # its timings too run under inference mode: the same graph
        return [(case.n, "inference", "static")]
    bi = matrix.batch_invariance
    static, dynamic = {case.n}, []
    if bi is not None:
        sweep = sweep_row_counts(case.n, bi.max_size, bi.sizes)
        if impl.run_dynamic is None:
            static |= checked_row_counts(case.n) | set(sweep)
        else:  # every check on the one graph: built at the sweep's top; N = 1 its own
            dynamic = [(r, "train", "dynamic") for r in sweep if r == sweep[0] or r == 1]
            if case.n >= 2 and max(sweep, default=0) < 2:  # the whole batch builds it
                dynamic.append((case.n, "train", "dynamic"))
    return ([(r, "train", "static") for r in sorted(static)] + dynamic
            + [(case.n, "no_grad", "static")])


def workers_for(items: list, cpus: int | None) -> int:
    """How many worker processes: one per spare CPU (two kept for the cell and the system),
    but 2 on a machine of 2 to 4 CPUs (the cell waits for them: two CPUs compile at once),
    at most :data:`MAX_WORKERS` and the number of calls; 0 when fewer than 2 would run.
    ``GATE_RESIDUAL_PRECOMPILE=N`` sets the number (0: off)."""
    forced = settings.get("GATE_RESIDUAL_PRECOMPILE")
    if forced is not None:  # 0: off; N: N workers whatever the CPUs (tests)
        return min(forced, len(items))
    n = min(MAX_WORKERS, max((cpus or 1) - 2, 2 if (cpus or 1) >= 2 else 0), len(items))
    return n if n >= 2 else 0


def load_only() -> None:
    """In a cell whose graphs are all stamped: no pool of compile processes. Inductor starts
    one (a process per CPU, each importing torch) at its first compile, to build kernels
    the cache already holds; with six cells on one host that was 96 processes. A graph
    missing despite the stamp then compiles in this process (``compile_threads`` is not
    part of inductor's cache key: the same graphs are hits)."""
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1


def cell_plan(matrix, cell, cases) -> list[dict]:
    """:func:`plan` for one cell: its cases on its target, the matrix's implementations that
    compile per shape and can run there, forward only in an inference mode."""
    from gate_residual_matrix.runner.cell import catalog as implementations
    from gate_residual_matrix.runner.plan.cells import cases_on

    compiling = [i for i in implementations.rows(matrix)
                 if (i.compiles_per_shape or cell.target in i.cached_kernels)
                 and not i.unavailable_reason(cell.target)]
    inference = bool(matrix.modes[cell.mode].torch.inference_mode)
    return plan(matrix, cases_on(cases, cell.target), compiling, target=cell.target,
                inference=inference)


def stamp_key(items: list[dict], *, torch_settings: dict, mode_env: dict, op: str,
              sizes: dict, target: str) -> str:
    """sha256 of what decides the compiled graphs besides the calls themselves: the mode's
    torch settings and variables, the op and its problem sizes, the target, torch's and
    triton's versions, and the implementations in ``items`` with their source files (where
    their ``run`` is defined). The calls are kept in the stamp (:func:`stamped` checks them)."""
    import inspect

    import torch

    from gate_residual_matrix.runner.cell import catalog as implementations

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    sources = {}
    for name in sorted({item["impl"] for item in items}):
        path = inspect.getsourcefile(implementations.get(name, op).run)
        sources[name] = hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None
    blob = json.dumps({"torch": torch_settings, "env": mode_env, "op": op, **sizes,
                       "target": target, "torch_version": torch.__version__,
                       "triton": triton_version, "sources": sources}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def stamp_path(key: str) -> Path:
    """Where the stamp of ``key`` lives: inside inductor's cache folder (``TORCHINDUCTOR_
    CACHE_DIR``, by default ``/tmp/torchinductor_<user>``), so it goes when the cache goes."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / "gate-residual-precompiled" / key


def _stamped_calls(key: str) -> set:
    try:
        data = json.loads(stamp_path(key).read_text(encoding="utf-8"))
        return {json.dumps(c, sort_keys=True) for c in data["calls"]}
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def stamped(key: str, items: list[dict]) -> bool:
    """Whether precompiles without failures under stamp ``key`` compiled every call of
    ``items`` into this cache (a resumed cell's calls are a subset of its first run's)."""
    return bool(items) and {json.dumps(c, sort_keys=True) for c in items} <= _stamped_calls(key)


def leave_stamp(key: str, items: list[dict], record: dict) -> None:
    """Record the calls of a finished precompile (``record``: :func:`run`'s) in the stamp of
    ``key``, with those already there; a record with failed workers adds none. An unwritable
    cache folder only loses time."""
    if record.get("failed"):
        return
    path = stamp_path(key)
    calls = sorted(_stamped_calls(key) | {json.dumps(c, sort_keys=True) for c in items})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"calls": [json.loads(c) for c in calls],
                                    "last": record}), encoding="utf-8")
    except OSError:
        pass


@dataclass
class ModePlan:
    """What one mode of a matrix file compiles: its calls (:func:`cell_plan`), the mode's
    torch settings and variables, the stamp key (:func:`stamp_key`), the op and its sizes."""

    mode: str
    items: list[dict]
    torch_settings: dict
    env: dict
    key: str
    op: str
    sizes: dict


def mode_plans(matrix_path: Path, *, target: str, modes: list[str],
               cases: list[str] | None = None) -> tuple[dict[str, str], list[ModePlan]]:
    """The modes of a matrix file that have graphs to compile on ``target`` (``cases``: the
    case ids the cells will run, default all), as :class:`ModePlan` in ``modes``' order, and
    the outcome of the others: ``{mode: "not on target ..." | "nothing to compile" |
    "stamped"}``. Raises :class:`runner.errors.ConfigError` for a bad matrix, an unknown mode
    or target, :class:`runner.errors.BackendError` for target cuda without a GPU."""
    from gate_residual_matrix.runner.cell import catalog as implementations
    from gate_residual_matrix.runner.config.matrix import load_matrix
    from gate_residual_matrix.runner.plan.cells import Cell

    matrix = load_matrix(matrix_path, known_implementations=implementations.known)
    _check(matrix, modes, target)
    p, plans = matrix.problem, []
    outcome: dict[str, str] = {}
    for mode in modes:
        if not matrix.modes[mode].runs_on(target):
            outcome[mode] = f"not on target {target}"
            continue
        selected = [c for c in matrix.cases if cases is None or c.id in cases]
        items = cell_plan(matrix, Cell("host", mode, target), selected)
        spec = matrix.modes[mode]
        torch_settings = spec.torch.model_dump()
        key = stamp_key(items, torch_settings=torch_settings, mode_env=dict(spec.env),
                        op=matrix.op, sizes=p.sizes, target=target)
        if not items:
            outcome[mode] = "nothing to compile"
        elif stamped(key, items):
            outcome[mode] = "stamped"
        else:
            plans.append(ModePlan(mode, items, torch_settings, dict(spec.env), key,
                                  matrix.op, dict(p.sizes)))
    return outcome, plans


def precompile_modes(matrix_path: Path, *, target: str, modes: list[str],
                     workers: int | None = None, say=None, timeout_s: float = TIMEOUT_S,
                     cases: list[str] | None = None) -> dict:
    """Fill the compile caches for the host cells ``modes`` x ``target`` of a matrix in one
    pool of ``workers`` processes (default: the CPUs less two; each with its mode's variables
    over this environment, and its torch settings) and leave each mode's stamp; modes whose
    stamp is there are not compiled again (:func:`mode_plans`). Two waves: the first mode
    alone, then the rest at once, whose graphs mostly reuse the first's Triton kernels (the
    same kernel source: a cache hit) instead of every mode compiling the same kernels side
    by side. Returns ``{mode: "stamped" | "compiled" | "nothing to compile" | "failed: ..."}``
    and ``"seconds"``. ``say(line)``, when given, hears what is about to be compiled;
    ``timeout_s`` bounds the whole (workers still running then are killed: their modes are
    ``failed``); ``cases``, the case ids the cells will run (default: every case).
    Raises as :func:`mode_plans`."""
    outcome: dict[str, str | float] = {}
    done, plans = mode_plans(matrix_path, target=target, modes=modes, cases=cases)
    outcome.update(done)
    if not plans:
        return outcome
    from gate_residual_matrix.runner.cell import environment

    n = workers or max(2, (environment.available_cpus() or 2) - 2)
    started = time.perf_counter()
    if say is not None:
        say(f"compiling {sum(len(pl.items) for pl in plans)} calls for "
            f"{', '.join(pl.mode for pl in plans)} on {target} in {n} workers ...")
    for wave in (plans[:1], plans[1:]):
        if wave:
            left = max(timeout_s - (time.perf_counter() - started), 1.0)
            record = run_groups([(pl.items, pl.torch_settings, {**os.environ, **pl.env})
                                 for pl in wave], workers=n, op=wave[0].op,
                                sizes=wave[0].sizes, target=target, timeout_s=left)
            for pl in wave:
                if record["failed"]:
                    outcome[pl.mode] = "failed: " + "; ".join(record["failed"])[:300]
                else:
                    leave_stamp(pl.key, pl.items, record)
                    outcome[pl.mode] = "compiled"
    outcome["seconds"] = round(time.perf_counter() - started, 3)
    return outcome


def _check(matrix, modes: list[str], target: str) -> None:
    """Raise :class:`runner.errors.ConfigError` for an unknown mode or target,
    :class:`runner.errors.BackendError` for target cuda without a GPU."""
    from gate_residual_matrix.runner.errors import BackendError, ConfigError

    unknown = [m for m in modes if m not in matrix.modes]
    if unknown:
        raise ConfigError(f"unknown mode(s) {', '.join(unknown)}: the matrix has "
                          f"{', '.join(matrix.modes)}")
    if target not in matrix.targets:
        raise ConfigError(f"unknown target {target!r}: the matrix has "
                          f"{', '.join(matrix.targets)}")
    if target == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise BackendError("target cuda needs a GPU: torch.cuda.is_available() is False "
                               "here (use --target cpu)")


def _positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of workers >= 1")
    return value


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gate_residual_matrix.runner.cell.precompile",
        description="Fill the compile caches (inductor's, Triton's) for host cells of a "
                    "matrix, every mode in one pool of worker processes, and leave a stamp "
                    "so that those cells start no workers of their own. Prints one JSON line: "
                    "mode -> compiled | stamped | nothing to compile | not on target | "
                    "failed. Exit 0, 1 (a worker failed), 2 (bad input), 4 (no GPU for "
                    "target cuda), 130 (interrupted).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--matrix", type=Path, default=Path("matrix.yaml"),
                        help="the matrix file")
    parser.add_argument("--target", default="cuda", help="the cells' target (cuda or cpu)")
    parser.add_argument("--mode", action="append", required=True,
                        help="a mode of the matrix (repeatable)")
    parser.add_argument("--workers", type=_positive, default=None,
                        help="worker processes (default: the CPUs less two)")
    args = parser.parse_args(argv)
    from gate_residual_matrix.runner.errors import BackendError, ConfigError

    signal.signal(signal.SIGTERM, _interrupted)
    try:
        outcome = precompile_modes(args.matrix, target=args.target, modes=args.mode,
                                   workers=args.workers,
                                   say=lambda line: print(f"[precompile] {line}",
                                                          file=sys.stderr, flush=True))
    except (ConfigError, BackendError) as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("error: interrupted: its workers were stopped; the stamps written so far "
              "stand", file=sys.stderr)
        return 130
    print(json.dumps(outcome))
    return 1 if any(str(v).startswith("failed") for v in outcome.values()) else 0


def _interrupted(signum, frame):  # SIGTERM: unwind as Ctrl-C does (workers killed)
    raise KeyboardInterrupt


if __name__ == "__main__":
    settings.setdefault("PYTHONUNBUFFERED")
    sys.exit(_cli(sys.argv[1:]))
