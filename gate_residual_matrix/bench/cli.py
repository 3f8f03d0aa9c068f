"""``python -m gate_residual_matrix.bench`` (``nox -s bench``): every op's implementations
timed as peers on one GPU, against the copy bandwidth, one file per op.

For each op (``--op``, repeatable; default every op of :data:`ops.OPS`) the rows of its matrix
file are the peers (:mod:`bench.peers`); rows that cannot run are named once with the reason.
Per dtype (``--dtype``, default bfloat16) and N (``--n``, default :data:`DEFAULT_NS`: inputs
larger than the L2) the peers and a device copy of the bytes the op must move are timed in
interleaved rounds (:mod:`bench.run`). Cases run N by N, every op at one N before the next N,
so a run stopped early (``--deadline``, a time limit) still has every op's largest case;
each op's ``<out>/<op>.json`` and ``.md`` are written after each of its cases. Before the
first case, worker processes compile every op's torch.compile graphs and numba kernels
(:mod:`bench.precompile`).

Exit codes: 0; 1 when an op failed outside its peers' calls (one line, the traceback in
``<out>/<op>.error.log``; ``bench.error.log`` for a failure of no op); 2 bad options or
matrix files; 4 no CUDA device (one line); 130 Ctrl-C (the finished cases are written).

Example::

    python -m gate_residual_matrix.bench --op rms_norm --n 32768 --dtype float32
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

from gate_residual_matrix import ops

DEFAULT_NS = (32768, 4096)
"""Row counts whose inputs are larger than an H200's L2 (60 MB) for every op at D = 5376,
the largest first."""
DTYPES = ("bfloat16", "float16", "float32")
GPU_CALLS = (1000, 10, 20)
"""(iters, warmup, rounds) by default on the GPU."""
REHEARSAL = ((3,), (3, 1, 3))
"""(N, (iters, warmup, rounds)) of the CPU rehearsal."""


def _positive(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) < 10**9:
        raise ValueError(text)
    return int(text)


_positive.__name__ = "integer from 1 to 10**9 - 1"


def parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m gate_residual_matrix.bench",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", action="append", choices=ops.OPS, default=None,
                   help="an op to time (repeatable; default: every op)")
    p.add_argument("--dtype", action="append", choices=DTYPES, default=None,
                   help="storage dtype (repeatable; default: bfloat16)")
    p.add_argument("--n", action="append", type=_positive, default=None, metavar="N",
                   help="rows (repeatable, run in this order; default: "
                        f"{', '.join(map(str, DEFAULT_NS))}; the matrices' small sizes, "
                        "e.g. 1 or 257, by asking)")
    p.add_argument("--out", type=Path, default=Path("reports/bench"),
                   help="where <op>.json and <op>.md go (default: reports/bench)")
    p.add_argument("--iters", type=_positive, default=None,
                   help=f"timed calls per peer and mode over all rounds (default {GPU_CALLS[0]})")
    p.add_argument("--warmup", type=int, default=None,
                   help=f"untimed calls before each peer's turn (default {GPU_CALLS[1]})")
    p.add_argument("--rounds", type=_positive, default=None,
                   help=f"interleaved rounds per case (default {GPU_CALLS[2]}; <= --iters)")
    p.add_argument("--peer", action="append", default=None, metavar="NAME",
                   help="time only this row (repeatable; a library row's name without its "
                        "version keeps every version)")
    p.add_argument("--skip", action="append", default=[], metavar="NAME",
                   help="leave this row out (repeatable; matched as --peer)")
    p.add_argument("--no-compile", action="store_true",
                   help="leave out the rows that compile per shape (torch.compile)")
    p.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                   help="start no case after this many seconds (the rest are listed as not "
                        "run)")
    # the CPU rehearsal: the whole path on tiny N with perf_counter; its figures mean nothing
    p.add_argument("--rehearse", action="store_true", help=argparse.SUPPRESS)
    return p


def settings(args: argparse.Namespace, p: argparse.ArgumentParser):
    """The :class:`bench.run.Settings` of the options; bad combinations are usage errors."""
    from gate_residual_matrix.bench.run import Settings

    ns, calls = REHEARSAL if args.rehearse else (DEFAULT_NS, GPU_CALLS)
    iters, warmup, rounds = (v if v is not None else d for v, d in
                             zip((args.iters, args.warmup, args.rounds), calls, strict=True))
    if rounds > iters or warmup < 0:
        p.error(f"--rounds {rounds} with --iters {iters}, --warmup {warmup}: expected 1 <= "
                "--rounds <= --iters (each round times at least one call per peer) and "
                "--warmup >= 0")
    return Settings(device="cpu" if args.rehearse else "cuda",
                    dtypes=tuple(dict.fromkeys(args.dtype or ("bfloat16",))),
                    ns=tuple(dict.fromkeys(args.n or ns)), iters=iters, warmup=warmup,
                    rounds=rounds, only=tuple(args.peer) if args.peer else None,
                    skip=tuple(args.skip), compile=not args.no_compile)


def check_names(names: list[str], selected: tuple[str, ...], option: str,
                p: argparse.ArgumentParser) -> None:
    """A usage error for a ``--peer`` / ``--skip`` name that no selected op's matrix has."""
    from gate_residual_matrix.bench.run import matrix_of
    from gate_residual_matrix.runner.cell import catalog

    known: dict[str, None] = {}
    for op in selected:
        for impl in catalog.rows(matrix_of(op)[1]):
            known.update(dict.fromkeys((impl.name.rsplit("-", 1)[0], impl.name)))
    unknown = [n for n in names if n not in known]
    if unknown:
        p.error(f"{option}: no row {unknown[0]!r} in the matrices of {', '.join(selected)} "
                f"(known: {', '.join(known)})")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (module docstring); returns the exit code."""
    import torch

    from gate_residual_matrix.runner.errors import BackendError, MatrixError

    p = parser()
    args = p.parse_args(argv)
    if not args.rehearse and not torch.cuda.is_available():
        # not a usage mistake: one line and the runner's "cannot run here" code
        print(f"error: no CUDA device: the benchmark needs a GPU (torch {torch.__version__} "
              "sees none)", file=sys.stderr)
        return BackendError.exit_code
    selected = tuple(dict.fromkeys(args.op or ops.OPS))
    try:
        s = settings(args, p)
        for option, names in (("--peer", args.peer or []), ("--skip", args.skip)):
            if names:
                check_names(names, selected, option, p)
        return bench(selected, s, args.out, deadline=args.deadline)
    except MatrixError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted: the finished cases are written", file=sys.stderr)
        return 130
    except Exception as err:  # anything else: one line, the traceback in a file
        _failure("bench", "run", err, args.out)
        return 1


def bench(selected: tuple[str, ...], s, out: Path, *, deadline: float | None = None) -> int:
    """Set up every op, precompile (on the GPU), run the cases N by N, write each op's files
    after each of its cases; 0, or 1 where an op failed outside its peers' calls."""
    from gate_residual_matrix.bench import report
    from gate_residual_matrix.bench.run import OpBench, plan
    from gate_residual_matrix.runner.cell import environment

    started = time.monotonic()
    env = environment.capture(s.device, {})
    benches: dict[str, OpBench] = {}
    failed: list[str] = []
    for op in selected:
        try:
            benches[op] = OpBench(op, s, env)
        except Exception as err:  # one op's setup failing is a line, not a crash
            failed.append(_failure(op, "setup", err, out))
            continue
        for k in benches[op].skipped:
            print(f"{op}: not timed: {k.name}: {k.reason}", flush=True)
    if s.device == "cuda" and benches:
        from gate_residual_matrix.bench.precompile import precompile

        try:
            precompile(list(benches.values()))
        except Exception as err:  # it only saves time: the first calls compile instead
            _failure("bench", "precompile", err, out)
    for dtype, n in plan(s):
        for op, b in list(benches.items()):
            if deadline is not None and time.monotonic() - started > deadline:
                b.not_run.append(f"{dtype} N={n} (--deadline {deadline:g} s)")
                report.write(b.document(complete=False), out)
                continue
            t0 = time.perf_counter()
            try:
                b.case(dtype, n)
            except Exception as err:  # as above; its finished cases are kept
                failed.append(_failure(op, f"{dtype} N={n}", err, out))
                b.not_run.append(f"{dtype} N={n} (error)")
            report.write(b.document(complete=False), out)
            print(f"{op} {dtype} N={n}: {len(b.table)} peers, "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
    for b in benches.values():
        path = report.write(b.document(complete=not b.not_run), out)
        print(path.with_suffix(".md").read_text(encoding="utf-8"))
        print(f"wrote {path} and {path.with_suffix('.md').name}", flush=True)
    for line in failed:
        print(line, file=sys.stderr)
    return 1 if failed else 0


def _failure(op: str, where: str, err: BaseException, out: Path) -> str:
    """One line for ``op``'s failure at ``where``; the traceback goes to
    ``<out>/<op>.error.log`` (appended)."""
    from gate_residual_matrix.runner.cell.case import one_line

    out.mkdir(parents=True, exist_ok=True)
    log = out / f"{op}.error.log"
    with log.open("a", encoding="utf-8") as f:
        f.write(f"--- {where}\n{traceback.format_exc()}\n")
    line = f"error: {op} {where}: {one_line(err, 300)} (traceback: {log})"
    print(line, file=sys.stderr, flush=True)
    return line
