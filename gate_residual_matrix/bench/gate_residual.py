"""Benchmark: gate_residual, every implementation in one run, against the copy bandwidth.

``python -m bench.gate_residual`` (``nox -s bench``) measures, in one process, with one harness
(:func:`contract.timing.median_ms`: CUDA events around each call of the public function, input
sets rotated so that one pass over them touches more than 3x the L2 cache):

* the device-to-device copy bandwidth (bytes read + written, a 2 GiB buffer), the ceiling;
* for each dtype and N, every peer of :mod:`bench.peers` (eager,
  ``torch.compile``, ours, RL-Kernel's op when its source tree is there, the SGLang and
  vllm-omni kernels when installed or kernel-only): the forward, and for those with a backward,
  forward+backward through ``torch.autograd.grad(out, (residual, gate, y), grad_out)`` (not
  ``out.backward()``: its AccumulateGrad copy of ``grad_out`` is autograd's,
  docs/performance.md). The peers of a case are timed interleaved
  (:mod:`bench.rounds`): ``--rounds`` rounds, in each every peer in turn
  gets ``--warmup`` untimed calls then its share of ``--iters`` timed ones, round r starting
  at peer r mod P; a peer's figure is the median of all its samples, with the 25th and 75th
  percentiles beside it (``forward_p25_ms`` ...), so that no ratio depends on which peer
  went first;
* our backward alone (``gate_residual_backward``) at the largest N;
* the host time per call of our entry points, broken down (:mod:`bench.host`).

Bytes that must move (``ops.gate_residual`` spec, ``bytes_moved``): forward 3*N*D*itemsize,
forward+backward twice that (``gate`` and ``index`` stay in L2). Ratios are only taken within
one run. Writes ``<out>/bench-<gpu>.json`` and ``bench-<gpu>.md`` (the table); the log-log
picture of time against N with the bandwidth floor is drawn from the JSON by ``python -m
runner report`` (runner/tables/render/plots.py) and linked from reports/README.md.
``--smoke`` runs the same code on the CPU with tiny shapes (CI: so it cannot rot; no figure
from it means anything), the host breakdown emulated
(:func:`bench.host.emulate_on_cpu`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gate_residual_matrix.bench.peers import LIBRARIES, Peer, peers
from gate_residual_matrix.bench.rounds import split_iters, time_peer, time_peers
from gate_residual_matrix.contract.timing import median_ms
from gate_residual_matrix.runner.cell import environment
from gate_residual_matrix.runner.errors import BackendError

__all__ = ["LIBRARIES", "PLAN", "Peer", "copy_bandwidth", "input_sets", "main", "markdown", "run",
           "time_peer", "time_peers"]

L2_BYTES = 60 * 2**20  # H200 (KINDS.md: 60 MB of L2); rotation keeps 3x this in flight
#: (dtype, N) of a full run, in the order run (the ends first: a run stopped by a deadline
#: keeps them): bf16 over the reference report's N, fp16 and fp32 at both ends
PLAN = ([("bfloat16", n) for n in (1, 32768, 257, 4097)]
        + [(dt, n) for dt in ("float16", "float32") for n in (32768, 1)])
SMOKE_PLAN = [("bfloat16", 1), ("bfloat16", 257)]


def copy_bandwidth(device: str, nbytes: int, iters: int) -> float:
    """Device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    t = median_ms(lambda _i: dst.copy_(src), device=device, warmup=5, iters=iters)
    return 2 * nbytes / (t["median_ms"] * 1e-3)


def input_sets(n: int, d: int, g: int, dtype: str, device: str, seed: int) -> list[dict]:
    """Enough independent input sets that one round over them touches > 3x the L2."""
    from gate_residual_matrix.ops.gate_residual.inputs import make_inputs

    base = make_inputs(n=n, d=d, g=g, dtype=dtype, index_dtype="int64", seed=seed).tensors
    per_set = sum(t.numel() * t.element_size() for t in base.values())
    count = max(1, min(64, math.ceil(3 * L2_BYTES / max(per_set, 1))))
    first = {k: v.to(device) for k, v in base.items()}
    return [first] + [{k: v.clone() for k, v in first.items()} for _ in range(count - 1)]


def backward_alone(sets: list[dict], device: str, *, iters: int, warmup: int) -> float:
    """Median ms of ``gate_residual_backward`` (``check_index=False``, as autograd's backward
    runs it: the forward checked the index): both kernels and the allocations."""
    backward: Callable[..., Any]
    if device == "cuda":
        from gate_residual_matrix.kernels.gate_residual import gate_residual_backward as backward
    else:  # the CPU twin (--smoke)
        from gate_residual_matrix.kernels.gate_residual_cpu import (
            gate_residual_backward_cpu as backward,
        )

    def call(i):
        x = sets[i % len(sets)]
        kwargs = {"check_index": False} if device == "cuda" else {}
        backward(x["grad_out"], x["gate"], x["y"], x["index"], **kwargs)

    return median_ms(call, device=device, warmup=warmup, iters=iters)["median_ms"]


def ratios(rows: list[dict], copy: float) -> None:
    """Add, in place, each row's ratios to its case's eager row and the fraction of the copy
    bandwidth its bytes reach (``*_vs_eager`` > 1: faster than eager)."""
    from gate_residual_matrix import ops
    spec = ops.get(ops.OPS[0])
    eager = {(r["dtype"], r["N"]): r for r in rows if r["impl"] == "eager"}
    for r in rows:
        size = torch.empty(0, dtype=getattr(torch, r["dtype"])).element_size()
        moved = spec.bytes_moved(r["N"], {"D": r["D"], "G": r["G"]}, size)
        base = eager.get((r["dtype"], r["N"]), {})
        for key, nbytes in (("forward", moved[0]), ("forward_backward", moved[1]),
                            ("backward", moved[1] - moved[0])):
            ms = r.get(f"{key}_ms")
            if not ms:
                continue
            r[f"{key}_copy_fraction"] = nbytes / (ms * 1e-3) / copy
            if base.get(f"{key}_ms"):
                r[f"{key}_vs_eager"] = base[f"{key}_ms"] / ms


def fastest(rows: list[dict]) -> None:
    """Mark, in place, each case's ``forward_vs_fastest`` / ``forward_backward_vs_fastest``:
    the fastest time of the case over this row's (1.0: this row is the fastest)."""
    for key in ("forward_ms", "forward_backward_ms"):
        best: dict[tuple, float] = {}
        for r in rows:
            if r.get(key):
                case = (r["dtype"], r["N"])
                best[case] = min(best.get(case, math.inf), r[key])
        for r in rows:
            if r.get(key):
                r[key.replace("_ms", "_vs_fastest")] = best[(r["dtype"], r["N"])] / r[key]


def markdown(doc: dict) -> str:
    """The run as Markdown: the timings per case, then the peers' code paths and why any did
    not run, then the host breakdown."""
    def ms(v):
        return f"{v:.3f}" if isinstance(v, (int, float)) else "—"

    def pct(v):
        return f"{100 * v:.0f}%" if isinstance(v, (int, float)) else "—"

    env = doc["environment"]
    rounds = doc.get("rounds")
    how = f"({doc['iters']} calls after {doc['warmup']} warm-up)"
    if rounds:  # the interleaved rounds (bench_rounds); files from before them have none
        shares = sorted(set(split_iters(doc["iters"], rounds)), reverse=True)
        how = (f"(interleaved rounds: {rounds} per case; in each, every peer in turn gets "
               f"{doc['warmup']} warm-up and {' or '.join(map(str, shares))} timed calls, the "
               "order rotated: round r starts at peer r mod P; each figure the median of the "
               f"peer's {doc['iters']} samples, their 25th and 75th percentiles in the JSON)")
    lines = [f"# {doc['title']}", "",
             f"Commit {doc.get('commit') or 'unknown'}; torch {env.get('torch')}, "
             f"{env.get('gpu') or 'CPU'}; copy bandwidth {doc['copy_GBps']:.0f} GB/s (read + "
             f"write). Median ms of CUDA events around each public call {how}; x eager: "
             "eager's time "
             "over this one's (> 1 is faster); % copy: bytes that must move over the time, "
             "as a fraction of the copy bandwidth. Forward+backward: torch.autograd.grad.", "",
             "| dtype | N | impl | fwd ms | fwd x eager | fwd % copy | fwd+bwd ms | "
             "fwd+bwd x eager | fwd+bwd % copy |", "| --- | ---: | --- | ---: | ---: | ---: | "
             "---: | ---: | ---: |"]
    for r in doc["rows"]:
        if "forward_ms" not in r and "error" not in r:
            continue
        name = r["impl"] + (f" (error: {r['error']})" if "error" in r else "")
        lines.append(f"| {r['dtype']} | {r['N']} | {name} | {ms(r.get('forward_ms'))} | "
                     f"{ms(r.get('forward_vs_eager'))} | {pct(r.get('forward_copy_fraction'))} | "
                     f"{ms(r.get('forward_backward_ms'))} | "
                     f"{ms(r.get('forward_backward_vs_eager'))} | "
                     f"{pct(r.get('forward_backward_copy_fraction'))} |")
    alone = [r for r in doc["rows"] if "backward_ms" in r]
    if alone:
        lines += ["", "Our backward alone (`gate_residual_backward`, both kernels and the "
                  "allocations): " + "; ".join(f"{r['dtype']} N={r['N']}: "
                                               f"{r['backward_ms']:.3f} ms "
                                               f"({pct(r.get('backward_copy_fraction'))} of copy)"
                                               for r in alone) + "."]
    lines += ["", "## Peers", ""]
    lines += [f"- **{p['name']}**: " + (f"not run: {p['unavailable']}" if p.get("unavailable")
                                        else p["ran"]) for p in doc["peers"]]
    host = doc.get("host_overhead_us")
    if host:
        lines += ["", f"## Host time per call (µs, {host['how']})", "",
                  "| what | µs |", "| --- | ---: |"]
        lines += [f"| {k} | {v:.2f} |" for k, v in host["per_call_us"].items()]
    return "\n".join(lines) + "\n"


def run(args, checkpoint=None) -> dict:
    """The whole benchmark (see the module docstring); returns the JSON document.
    ``checkpoint(doc)``, when given, gets the document so far after each case (a run stopped
    by a deadline keeps the cases it finished)."""
    device = "cpu" if args.smoke else "cuda"
    d, g = (64, 3) if args.smoke else (5376, 9)
    plan = list(dict.fromkeys(args.case)) if args.case else (SMOKE_PLAN if args.smoke else PLAN)
    iters, warmup = (3, 1) if args.smoke else (args.iters, args.warmup)
    rounds = min(args.rounds, iters) if args.smoke else args.rounds
    copy = copy_bandwidth(device, (8 << 20) if args.smoke else (2 << 30), iters)
    table = peers(device, with_compile=not (args.no_compile or args.smoke),
                  libraries=args.library if args.library is not None else LIBRARIES,
                  only=args.peer)
    # the host breakdown first, on an idle GPU (and kept if a deadline stops the run)
    host = host_overhead(device, d, g, quick=args.smoke)
    rows: list[dict[str, Any]] = []
    seconds: dict[str, float] = {}
    largest = {dt: max(m for other, m in plan if other == dt) for dt, _ in plan}
    for dtype, n in plan:
        sets = input_sets(n, d, g, dtype, device, seed=1)
        ran = [p for p in table if not p.unavailable and p.takes(dtype)]
        timed = time_peers(ran, sets, dtype, n, device, iters=iters, warmup=warmup,
                           rounds=rounds, seconds=seconds)
        rows += [{"dtype": dtype, "N": n, "D": d, "G": g, "impl": peer.name, "sets": len(sets),
                  **result} for peer, result in zip(ran, timed, strict=True)]
        if n == largest[dtype]:
            rows.append({"dtype": dtype, "N": n, "D": d, "G": g, "impl": "numba backward alone",
                         "backward_ms": backward_alone(sets, device, iters=iters,
                                                       warmup=warmup)})
        del sets
        if checkpoint is not None:
            checkpoint(_document(device, copy, (iters, warmup, rounds), table, host, rows,
                                 seconds, complete=False))
    return _document(device, copy, (iters, warmup, rounds), table, host, rows, seconds,
                     complete=True)


def _document(device, copy, calls, table, host, rows, seconds, *, complete: bool) -> dict:
    iters, warmup, rounds = calls
    order = {"bfloat16": 0, "float16": 1, "float32": 2}
    rows = sorted((dict(r) for r in rows), key=lambda r: (order.get(r["dtype"], 3), r["N"]))
    ratios(rows, copy)
    fastest(rows)
    from gate_residual_matrix.kernels.launch import DRIVER

    env = environment.capture(device, {})
    project = env.get("project") or {}
    api = ("not loaded" if not DRIVER or "ex" not in DRIVER else
           "cuLaunchKernelEx" if DRIVER["ex"] is not None else "cuLaunchKernel")
    return {"title": f"gate_residual benchmark ({env.get('gpu') or env.get('cpu')})",
            "device": device, "commit": project.get("commit"), "dirty": project.get("dirty"),
            "complete": complete, "launch_api": api, "copy_GBps": copy / 1e9,
            "iters": iters, "warmup": warmup, "rounds": rounds, "environment": env,
            "seconds_per_peer": seconds,
            "peers": [{"name": p.name, "ran": p.ran, "unavailable": p.unavailable,
                       "dtypes": p.dtypes} for p in table],
            "host_overhead_us": host, "rows": rows}


def host_overhead(device: str, d: int, g: int, *, quick: bool) -> dict:
    """:func:`bench.host.host_costs` at N = 1 (bf16): on the GPU as it
    is, on the CPU emulated."""
    from gate_residual_matrix.bench.host import emulate_on_cpu, host_costs

    sets = input_sets(1, d, g, "bfloat16", device, seed=2)
    calls, repeats = (50, 2) if quick else (1000, 5)
    if device == "cuda":
        how = "H200 as measured: perf_counter over back-to-back calls, the least of 5 rounds"
        return {"how": how, "per_call_us": host_costs(sets[0], calls=calls, repeats=repeats)}
    with emulate_on_cpu():
        costs = host_costs(sets[0], calls=calls, repeats=repeats)
    return {"how": "CPU tensors, the driver call replaced by a no-op C function "
                   "(bench/host.py)", "per_call_us": costs}


def _case(text: str) -> tuple[str, int]:
    """``DTYPE:N`` of ``--case`` as ``(dtype, N)``; argparse turns the ValueError into a
    one-line usage error."""
    dtype, _, n = text.partition(":")
    if (dtype not in ("bfloat16", "float16", "float32") or not re.fullmatch(r"[0-9]{1,9}", n)
            or int(n) < 1):
        raise ValueError(text)
    return dtype, int(n)


_case.__name__ = "DTYPE:N (bfloat16, float16 or float32, 1 <= N < 10**9)"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table; write the JSON and the Markdown. Returns 0, or 4
    (:class:`runner.errors.BackendError`'s code, one line on stderr) where no CUDA device is
    there and neither ``--smoke`` nor ``--host`` is given. Bad options: argparse's exit 2."""
    parser = argparse.ArgumentParser(prog="python -m gate_residual_matrix.bench.gate_residual",
                                     description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("reports/bench"))
    parser.add_argument("--iters", type=int, default=1000,
                        help="timed calls per peer and mode over all rounds")
    parser.add_argument("--warmup", type=int, default=10,
                        help="untimed calls before each peer's timed calls, in every round")
    parser.add_argument("--rounds", type=int, default=20,
                        help="interleaved rounds per case (each peer times iters/rounds "
                             "calls per round, the order rotated; default 20)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (CI)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--library", action="append", default=None, metavar="IMPL-VERSION",
                        help="library rows to time (repeatable; default: "
                             f"{', '.join(LIBRARIES)})")
    parser.add_argument("--case", action="append", type=_case, default=None,
                        metavar="DTYPE:N", help="time only this case (repeatable; default: "
                        "the full plan), e.g. bfloat16:1")
    parser.add_argument("--peer", action="append", default=None, metavar="NAME",
                        help="time only this peer (repeatable: eager, compiled, numba, "
                             "rl_kernel_h3 or a library row; default: all). Our backward-"
                             "alone row and host breakdown are measured in every run")
    parser.add_argument("--precompile", action="store_true",
                        help="only compile torch.compile's graphs into inductor's cache")
    parser.add_argument("--host", action="store_true",
                        help="only the host time per call (on the CPU: emulated)")
    args = parser.parse_args(argv)
    known = ["eager", "compiled", "numba", "rl_kernel_h3",
             *(args.library if args.library is not None else LIBRARIES)]
    unknown = [name for name in args.peer or [] if name not in known]
    if unknown:
        parser.error(f"--peer: no peer {unknown[0]!r} (known: {', '.join(known)})")
    if args.rounds < 1 or (not args.smoke and args.rounds > args.iters):
        parser.error(f"--rounds {args.rounds} with --iters {args.iters}: expected 1 <= "
                     "--rounds <= --iters (each round times at least one call per peer)")
    if not args.smoke and not args.host and not torch.cuda.is_available():
        # not a usage mistake: one line and the runner's "cannot run here" code, no usage block
        print("error: no CUDA device: the benchmark needs a GPU (--smoke runs its code path "
              "on tiny CPU shapes, and its figures mean nothing; --host times the host path "
              "emulated)", file=sys.stderr)
        return BackendError.exit_code
    if args.host:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        host = host_overhead(device, 5376, 9, quick=False)
        print(f"host time per call (µs; {host['how']}):")
        for k, v in host["per_call_us"].items():
            print(f"  {k:40s} {v:8.2f}")
        return 0
    if args.precompile:
        precompile(PLAN, 5376, 9)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)

    def write(doc: dict) -> Path:
        name = (doc["environment"].get("gpu") or "cpu").replace(" ", "-").lower()
        stem = args.out / f"bench-{name}{'-smoke' if args.smoke else ''}"
        stem.with_suffix(".json").write_text(json.dumps(doc, indent=2))
        stem.with_suffix(".md").write_text(markdown(doc))
        return stem

    stem = write(run(args, checkpoint=write))
    print(stem.with_suffix(".md").read_text())
    print(f"wrote {stem}.json and .md")
    return 0


def precompile(plan, d: int, g: int) -> None:
    """Compile the ``compiled`` peer's graphs of ``plan`` into inductor's on-disk cache (one
    call each), so that a benchmark process started next finds them (run it beside other
    work, before the benchmark)."""
    from gate_residual_matrix.bench.peers import compiled_peer

    peer = compiled_peer("cuda")
    if peer.unavailable:
        print(f"compiled: {peer.unavailable}")
        return
    for dtype, n in plan:
        t0 = time.perf_counter()
        x = input_sets(n, d, g, dtype, "cuda", seed=1)[:1]
        time_peer(peer, x, dtype, n, "cuda", iters=1, warmup=1)
        print(f"compiled {dtype} N={n}: {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        raise SystemExit(main())
