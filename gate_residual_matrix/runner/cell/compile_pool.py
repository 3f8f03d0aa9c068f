"""The pool of compile workers behind :mod:`runner.cell.precompile`: processes that each make
the calls of a plan file once (so that inductor's caches hold their graphs), waited for with a
line on their progress at least every :data:`HEARTBEAT_S`.

Usage (what :func:`run_groups` starts)::

    python -m gate_residual_matrix.runner.cell.compile_pool PLAN.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gate_residual_matrix.runner.backends.lifetime import die_with_parent
from gate_residual_matrix.runner.cell import heartbeat

TIMEOUT_S = 900.0
"""The longest a precompile waits for its workers (docs/performance.md, "Cell time", has
what a cold precompile takes on two CPUs). Bounded by the cell's own timeout anyway; this
cap only keeps a hung worker from holding a cell for ever."""

HEARTBEAT_S = heartbeat.EVERY_S
"""At most this long without a line while a precompile runs (counted from the cell
process's last line: :func:`runner.cell.heartbeat.quiet_for`)."""


def run(items: list[dict], *, torch_settings: dict, op: str, sizes: dict, target: str,
        workers: int, timeout_s: float = TIMEOUT_S, env: dict | None = None) -> dict:
    """Run the calls of ``items`` in ``workers`` processes (round robin, so each starts with
    the first cases) and wait for them, at most ``timeout_s``; returns the record for
    ``environment.precompile``: workers, calls, seconds, and the workers that failed.
    ``env``: the workers' environment (default: this process's)."""
    return run_groups([(items, torch_settings, env)], op=op, sizes=sizes, target=target,
                      workers=workers, timeout_s=timeout_s)


def run_groups(groups: list[tuple], *, op: str, sizes: dict, target: str, workers: int,
               timeout_s: float = TIMEOUT_S, say=None) -> dict:
    """:func:`run` for several modes at once: ``groups`` is ``[(items, torch_settings, env or
    None), ...]``; the ``workers`` processes are shared out in proportion to the calls (at
    least one per group with calls), so one pool compiles every mode's graphs. ``say(line)``
    hears a line on the calls done at least every :data:`HEARTBEAT_S` (default: a ``[cell]``
    line on stderr, which the runner shows). The workers take no GPU lock, whatever their
    environment says: a cell's own precompile holds it for them, and the GPU host's
    compile-ahead holds the lock's compile gate."""
    started = time.perf_counter()
    procs, plans = [], []
    groups = [grp for grp in groups if grp[0]]
    total = sum(len(grp[0]) for grp in groups) or 1
    say = say or _say
    with tempfile.TemporaryDirectory(prefix="gate-residual-precompile-") as tmp:
        for gi, (items, torch_settings, env) in enumerate(groups):
            # one compile thread per worker: the workers are the parallelism (inductor's
            # compile_threads is outside its cache keys, so the cell finds the same entries)
            env = {"TORCHINDUCTOR_COMPILE_THREADS": "1", **(env or os.environ)}
            share = max(1, min(len(items), round(workers * len(items) / total)))
            for w in range(share):
                path = Path(tmp) / f"plan-{gi}-{w}.json"
                path.write_text(json.dumps({"torch": torch_settings, "op": op, "sizes": sizes,
                                            "target": target, "calls": items[w::share]}),
                                encoding="utf-8")
                plans.append(path)
                with open(f"{path}.err", "w", encoding="utf-8") as err:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "gate_residual_matrix.runner.cell.compile_pool",
                         str(path)],
                        env=env, stdout=subprocess.DEVNULL, stderr=err,
                        preexec_fn=die_with_parent))
        try:
            failed = _wait(procs, plans, started, timeout_s,
                           lambda done, secs: say(f"{op} precompile: {done} of {total} calls "
                                                  f"in {len(procs)} workers, {secs:.0f} s"))
        except BaseException:  # Ctrl-C, SIGTERM (raised by _cli): no worker outlives us
            for proc in procs:
                proc.kill()
            for proc in procs:
                proc.wait()
            raise
    return {"workers": len(procs), "calls": sum(len(grp[0]) for grp in groups),
            "seconds": round(time.perf_counter() - started, 3), "failed": failed}


def _say(line: str) -> None:
    print(f"[cell] {line}", file=sys.stderr, flush=True)


def _wait(procs: list, plans: list[Path], started: float, timeout_s: float,
          beat) -> list[str]:
    """Wait for the workers (each writes one line per call done to its plan's ``.done``
    file), calling ``beat(calls done, seconds)`` every :data:`HEARTBEAT_S`; kill those
    still running at ``timeout_s``. Returns the failures, one line per worker."""
    failed = []
    while any(proc.poll() is None for proc in procs):
        now = time.perf_counter()
        if now - started > timeout_s:
            for w, proc in enumerate(procs):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                    failed.append(f"worker {w}: timed out after {timeout_s:g} s")
            break
        if heartbeat.quiet_for() >= HEARTBEAT_S:
            beat(sum(_lines(Path(f"{plan}.done")) for plan in plans), now - started)
            heartbeat.said()
        time.sleep(0.5)
    for w, (proc, plan) in enumerate(zip(procs, plans, strict=True)):
        if proc.returncode and not any(f.startswith(f"worker {w}:") for f in failed):
            err = Path(f"{plan}.err").read_text(encoding="utf-8", errors="replace")
            last_line = err.strip().splitlines()[-1:] or [""]
            failed.append(f"worker {w}: exit code {proc.returncode}: {last_line[0][:200]}")
    return failed


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def _inputs(call: dict, op: str, sizes: dict, device: str) -> dict:
    """Zero inputs of ``op`` (its spec's shapes) for one call: the graphs depend on shapes
    and dtypes, not values."""
    import torch

    from gate_residual_matrix import ops
    from gate_residual_matrix.contract.inputs import INDEX_DTYPES, TORCH_DTYPES

    spec = ops.get(op)
    dt, n = TORCH_DTYPES[call["dtype"]], call["rows"]
    x = {name: torch.zeros(spec.shape(name, n=n, sizes=sizes), dtype=dt, device=device)
         for name in spec.inputs}
    if spec.index:
        x[spec.index] = torch.zeros(n, dtype=INDEX_DTYPES[call["index_dtype"]], device=device)
    return x


def claim(path: str | Path) -> int:
    """The next call index of a shared plan, taken from its claims file (a counter under
    ``flock``): each index goes to exactly one of the workers that share the plan. The
    counter is written over in place, never emptied, so a reader without the lock sees the
    old number or the new one."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    with os.fdopen(fd, "r+b") as counter:
        fcntl.flock(counter, fcntl.LOCK_EX)  # dropped when the file is closed
        text = counter.read().strip()
        index = int(text) if text else 0
        counter.seek(0)
        counter.write(b"%d" % (index + 1))  # never shorter than what it replaces
        counter.flush()
    return index


def _calls(spec: dict):
    """``(index, call)`` of a plan: all of them in order, or, for a shared plan (its
    ``claims`` file), those this worker claims (:func:`claim`), until none is left."""
    calls = spec["calls"]
    if not spec.get("claims"):
        yield from enumerate(calls)
        return
    while (index := claim(spec["claims"])) < len(calls):
        yield index, calls[index]


def main(argv: list[str]) -> int:
    """Worker: apply the mode's torch settings, then make each call of the plan file once
    (a call's own ``op`` and ``sizes``, where it has them, over the plan's); each call done
    is one line (its index) in ``PLAN.done``. In a shared plan (its ``claims``), a call that
    raises is one line in ``PLAN.lost`` (index, tab, error) and one on stderr, and the worker
    goes on; ``argv[1]``, when given, is a file that holds the index of the call in hand."""
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    from gate_residual_matrix.contract import gpu_lock

    # inherited from a cell that holds the lock for this pool: waiting would deadlock
    os.environ.pop(gpu_lock.ENV, None)
    import torch

    from gate_residual_matrix.runner.cell import modes
    from gate_residual_matrix.runner.config.matrix import TorchSettings

    modes.apply_torch_settings(TorchSettings(**spec["torch"]))
    device = "cuda" if spec["target"] == "cuda" else "cpu"
    for index, call in _calls(spec):
        if len(argv) > 1:
            Path(argv[1]).write_text(str(index), encoding="utf-8")
        try:
            _make(call, spec, device)
        except Exception as err:
            if not spec.get("claims"):
                raise
            line = f"{type(err).__name__}: {err}".replace("\n", " ")[:300]
            print(f"call {index} ({call.get('impl')}, {call.get('dtype')}, "
                  f"{call.get('rows')} rows): {line}", file=sys.stderr, flush=True)
            with open(f"{argv[0]}.lost", "a", encoding="utf-8") as lost:
                lost.write(f"{index}\t{call.get('impl')}: {line}\n")
            continue
        with open(f"{argv[0]}.done", "a", encoding="utf-8") as done:  # progress, and which
            done.write(f"{index}\n")
    if device == "cuda":
        torch.cuda.synchronize()
    return 0


def _make(call: dict, spec: dict, device: str) -> None:
    """One call of a plan."""
    import torch

    from gate_residual_matrix.runner.cell import catalog as implementations

    op, sizes = call.get("op", spec.get("op")), call.get("sizes", spec.get("sizes"))
    impl = implementations.get(call["impl"], op)
    run = impl.run_dynamic if call.get("graph") == "dynamic" else impl.run
    x = _inputs(call, op, sizes, device)
    if call["grad"] == "inference":
        with torch.inference_mode():
            run(x, backward=False)
    else:
        run(x, backward=call["grad"] == "train")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))  # a worker, started by run_groups with its plan file
