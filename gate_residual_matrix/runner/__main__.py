"""Command line: ``python -m gate_residual_matrix {matrix,cell,build,base-image,report,compare,
gpu-host} ...`` (nox).

Every :class:`runner.errors.MatrixError` is caught here, printed as one line on stderr and
mapped to its exit code (config 2, report 3, backend 4, failed cells 5, a verdict that
regressed against a baseline 6: ``compare``, ``matrix --expect``). SIGINT (Ctrl-C) and
SIGTERM raise :class:`runner.errors.Interrupted` wherever the run is; the clean-ups on its way
out kill the running cell's process group or container and remove its staging directory, and
the command exits 128 + the signal: 130 or 143. A second signal while that happens is ignored
(SIGKILL is not). ``report`` (and ``matrix``, which renders the same tables) prints a
``warning:`` line per file it cannot read; ``report`` then exits 3, after writing the tables.

Examples::

    python -m gate_residual_matrix matrix --target cpu --case 257
    python -m gate_residual_matrix matrix --backend docker --build --stack cpu-torch2.13 \
        --target cpu
    python -m gate_residual_matrix build --stack cpu-torch2.13
    python -m gate_residual_matrix base-image          # root: debootstrap + docker import
    python -m gate_residual_matrix report
    python -m gate_residual_matrix compare old-reports/ reports/ --allow "error:grew"
    python -m gate_residual_matrix matrix --expect reports/ --target cpu --case 257
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

from gate_residual_matrix import settings
from gate_residual_matrix.runner.backends.interrupts import signals_interrupt
from gate_residual_matrix.runner.compare_reports.options import (
    add_rule_options,
    refuse_without_expect,
)
from gate_residual_matrix.runner.config.paths import nonempty_path, output_folder
from gate_residual_matrix.runner.errors import (
    CellsFailed,
    ConfigError,
    ImageError,
    Interrupted,
    MatrixError,
    ReportError,
)
from gate_residual_matrix.runner.untrusted.names import shown

DEFAULT_MATRIX = Path("matrix.yaml")
DEFAULT_REPORTS = Path("reports")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's errors: ConfigError (exit 2)
        raise ConfigError(f"{self.prog}: {message}")


def _add_selection(p: argparse.ArgumentParser, several: bool = False) -> None:
    """The options that choose cells: matrix file(s), reports folder, stacks, modes, targets,
    cases; ``several``: more than one matrix file, and ``--op``."""
    if several:
        p.add_argument("--matrix", type=nonempty_path, action="append", help="a matrix "
                       "file (repeatable; default: every op's, runner/config/matrices.py)")
        p.add_argument("--op", action="append", help="run only this op (repeatable)")
    else:
        p.add_argument("--matrix", type=nonempty_path, default=DEFAULT_MATRIX,
                       help="matrix.yaml path")
    p.add_argument("--reports", type=nonempty_path, default=DEFAULT_REPORTS,
                   help="report directory")
    p.add_argument("--stack", action="append", help="run only this stack (repeatable)")
    p.add_argument("--mode", action="append", help="run only this mode (repeatable)")
    p.add_argument("--target", action="append", help="cuda or cpu (repeatable)")
    p.add_argument("--case", action="append", help='case id, e.g. 257 or "257-specials"')


def _add_matrix_command(sub: argparse._SubParsersAction) -> None:
    """The ``matrix`` subcommand: run the selected cells, write reports and tables."""
    m = sub.add_parser("matrix", help="run the selected cells, write reports and tables")
    _add_selection(m, several=True)
    m.add_argument("--backend", default="auto", help="docker, host or auto (default: docker "
                   "when an engine answers, else host; docker stacks are skipped on host)")
    m.add_argument("--gpus", default="all", help='GPUs for docker cuda cells: "all" or ids "0,1"')
    m.add_argument("--force", action="store_true", help="re-run cells whose report is current")
    m.add_argument("--build", action="store_true", help="build the missing images of the "
                   "selected docker stacks first (without it none is built: those stacks are "
                   "skipped, or with --backend docker the run stops, exit 4)")
    m.add_argument("--timeout", type=float, default=3600.0, help="seconds per cell")
    m.add_argument("--no-tables", action="store_true", help="write the reports only, not the "
                   "tables (as several runs into one folder at once do: the GPU host's modes "
                   "step; render them afterwards with report)")
    m.add_argument("--shards", metavar="N|auto", help="processes per host cell, each with "
                   "part of its cases (default auto: on cuda one per dtype group of the "
                   "cases, up to one per 2 CPUs and 8; on cpu 1; N: at most one per case); "
                   "sets $GATE_RESIDUAL_SHARDS")
    m.add_argument("--abba", metavar="MODE_B", help="run each cell's process in A-B-B-A order "
                   "against this mode and record repeatable_across_processes")
    m.add_argument("--cluster", metavar="ray://HOST:PORT|auto", help="run the cells as tasks "
                   "of this Ray cluster (auto: $RAY_ADDRESS); needs .[ray] (docs/cluster.md)")
    m.add_argument("--gpu-model", metavar="NAME", help='with --cluster: run every cell on '
                   'nodes offering the resource "gpu:NAME", e.g. "NVIDIA H200"')
    m.add_argument("--retries", type=int, default=2, help="with --cluster: runs again of a "
                   "cell whose node died (default: %(default)s)")
    m.add_argument("--expect", type=Path, metavar="BASELINE_DIR", help="then compare the "
                   "reports with these (last known-good) ones and exit with compare's code "
                   "(6: a verdict regressed; docs/ci.md)")
    add_rule_options(m)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m gate_residual_matrix", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_matrix_command(sub)

    c = sub.add_parser("cell", help="run one cell in this process (used by the backends)")
    _add_selection(c)
    c.add_argument("--run-id", default="", help="written into the report")
    c.add_argument("--no-timings", action="store_true", help="skip the timing loops")

    b = sub.add_parser("build", help="build the images of the docker stacks (those missing)")
    b.add_argument("--matrix", type=nonempty_path, default=DEFAULT_MATRIX, help="matrix.yaml path")
    b.add_argument("--stack", action="append", help="build only this stack (repeatable)")
    b.add_argument("--force", action="store_true", help="rebuild without the layer cache")
    b.add_argument("--prune", action="store_true",
                   help="then remove each stack's images of older content")

    i = sub.add_parser("base-image", help="make a base image without a registry: debootstrap "
                       "+ docker import (root; see docs/containers.md)")
    i.add_argument("--name", default=None, help="image name:tag (default: the one matrix.yaml's "
                   "cpu stack uses, gate-residual/base:bookworm-py3.11)")
    i.add_argument("--suite", default="bookworm", help="Debian suite")
    i.add_argument("--mirror", default="http://deb.debian.org/debian", help="Debian mirror")
    i.add_argument("--force", action="store_true", help="make it again although it exists")

    r = sub.add_parser("report", help="render README.md, index.html, summary.csv|json from "
                       "every report (options: docs/tables.md)")
    r.add_argument("--reports", type=nonempty_path, default=DEFAULT_REPORTS,
                   help="directory of the JSON reports to read (default: %(default)s)")
    r.add_argument("--out", type=nonempty_path, help="write the outputs here (default: --reports)")
    for facet in ("op", "stack", "mode", "target", "dtype", "gpu", "impl"):
        r.add_argument(f"--{facet}", action="append", help=f"show only this {facet} (repeatable)")
    r.add_argument("--ab", nargs=2, action="append", metavar=("CELL_A", "CELL_B"),
                   help="show these two cells side by side (repeatable)")

    k = sub.add_parser("compare", help="list the verdicts that changed from BASELINE_DIR to "
                       "NEW_DIR; exit 6 when one regressed (docs/ci.md)")
    k.add_argument("baseline", type=Path, metavar="BASELINE_DIR",
                   help="the last known-good reports")
    k.add_argument("new", type=Path, metavar="NEW_DIR", nargs="?", default=DEFAULT_REPORTS,
                   help="the reports to check (default: %(default)s)")
    add_rule_options(k)
    from gate_residual_matrix.runner.gpu_host.command import add_parser as add_gpu_host

    add_gpu_host(sub)
    return parser


def _cmd_matrix(args: argparse.Namespace) -> int:
    if args.expect is not None:
        from gate_residual_matrix.runner.compare_reports.command import expect

        return expect(args, _run_matrix)
    refuse_without_expect(args)
    return _run_matrix(args)


def _job_cells(runs, args: argparse.Namespace) -> dict[str, float | None]:
    """The cells of every file of the job that this host will likely run, with their
    previous reports' times (:mod:`runner.cell.job_clock`): a target it has, a host stack (or a
    docker one with ``--backend docker``). A file that does not load counts nothing here:
    its error comes when it runs."""
    from gate_residual_matrix.runner.backends.local import cuda_available
    from gate_residual_matrix.runner.cell import job_clock
    from gate_residual_matrix.runner.pipeline import Request, load, select

    gpu, cells = cuda_available(), []
    for run in runs:
        try:
            request, matrix = load(Request(run.path, args.reports, stacks=run.stacks,
                                           modes=run.modes, targets=args.target,
                                           cases=run.cases))
            chosen = select(matrix, request).cells
        except MatrixError:
            continue
        cells += [(c.id, (c.target != "cuda" or gpu) and (
            matrix.stacks[c.stack].kind == "host" or args.backend == "docker"))
            for c in chosen]
    return job_clock.planned(cells, args.reports)


def _run_matrix(args: argparse.Namespace) -> int:
    from gate_residual_matrix.runner.backends import shards
    from gate_residual_matrix.runner.cell import job_clock
    from gate_residual_matrix.runner.config.matrices import DEFAULT_MATRICES, plan
    from gate_residual_matrix.runner.outcome import failed, summary
    from gate_residual_matrix.runner.pipeline import render_tables, run_matrix

    if args.shards is not None:
        os.environ[shards.ENV] = args.shards
    try:
        shards.requested()
    except ValueError as err:
        raise ConfigError(f"--shards: {err}" if args.shards is not None else str(err)) from None
    runs = plan(args.matrix or DEFAULT_MATRICES, ops=args.op, stacks=args.stack,
                modes=args.mode, cases=args.case)
    tables = not getattr(args, "no_tables", False)
    outcomes = []
    try:
        with job_clock.start({} if args.cluster else _job_cells(runs, args)):
            for run in runs:
                outcomes += run_matrix(
                    run.path, reports_dir=args.reports, stacks=run.stacks, modes=run.modes,
                    targets=args.target, cases=run.cases, backend=args.backend,
                    force=args.force, timeout_s=args.timeout, gpus=args.gpus, abba=args.abba,
                    build=args.build, cluster=args.cluster, gpu_model=args.gpu_model,
                    retries=args.retries, render=False)
    except MatrixError:
        if outcomes and tables:  # the tables of the files that ran, then the error
            render_tables(args.reports)
        raise
    if tables:
        render_tables(args.reports)
    print(summary(outcomes))
    if tables:
        from gate_residual_matrix.runner.tables import OUTPUTS

        print(f"[runner] tables: {', '.join(shown(args.reports / n) for n in OUTPUTS)}")
        _warn_unreadable(args.reports / "README.md")
    bad = failed(outcomes)
    if bad:
        raise CellsFailed(f"{len(bad)} of {len(outcomes)} cells did not end ok: "
                          + ", ".join(f"{o.cell} ({o.status})" for o in bad))
    return 0


def _cmd_build(args: argparse.Namespace) -> int:
    from gate_residual_matrix.runner.backends.docker.engine import build_stacks

    results = build_stacks(args.matrix, stacks=args.stack, force=args.force, prune=args.prune)
    bad = [r for r in results if not r.ok]
    if bad:
        raise ImageError(f"{len(bad)} of {len(results)} images did not build: "
                         + ", ".join(f"{r.stack} ({r.reason})" for r in bad))
    return 0


def _cmd_base_image(args: argparse.Namespace) -> int:
    from gate_residual_matrix.runner.backends.docker import base_image

    base_image.make(args.name or base_image.DEFAULT_NAME, suite=args.suite, mirror=args.mirror,
                    force=args.force)
    return 0


def _cmd_cell(args: argparse.Namespace) -> int:
    from gate_residual_matrix.runner.backends.process import run_cell_process

    cell_id, status, path = run_cell_process(
        args.matrix, args.reports, stacks=args.stack, modes=args.mode, targets=args.target,
        cases=args.case, run_id=args.run_id, timings=not args.no_timings)
    print(f"[runner] {cell_id}: {status} -> {path}")
    return 0


def _warn_unreadable(tables_path: Path) -> list[str]:
    """Print ``warning: <file>: <problem>`` on stderr for each file the tables could not
    read (their ``summary.json`` lists them); return those lines."""
    try:
        listed = json.loads((tables_path.parent / "summary.json").read_text(encoding="utf-8"))
        unreadable = listed.get("unreadable") or []
    except (OSError, ValueError, AttributeError):
        return []
    lines = [f"warning: {shown(tables_path.parent)}/{shown(str(u['file']))}: "
             f"{shown(str(u['problem']))}" for u in unreadable]
    for line in lines:
        print(line, file=sys.stderr)
    return lines


def _cmd_report(args: argparse.Namespace) -> int:
    from gate_residual_matrix.runner import tables
    from gate_residual_matrix.runner.tables import FACETS, Filters

    if not args.reports.is_dir():
        found = "not a directory" if args.reports.exists() else "no such directory"
        raise ConfigError(f"--reports: expected a directory of reports, got {args.reports} "
                          f"({found})")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out: expected a directory for the tables, got {args.out} "
                          "(not a directory)")
    output_folder(args.reports if args.out is None else args.out,
                  "--reports" if args.out is None else "--out")
    filters = Filters.from_lists(**{f: getattr(args, f) for f in (*FACETS, "impl")})
    out = None if args.out is None else args.out / tables.OUTPUTS[0]
    try:
        path = tables.write_tables(args.reports, out, filters=filters, ab=args.ab)
    except OSError as err:
        raise ReportError(f"{args.out or args.reports}: cannot write the tables: "
                          f"{err.strerror or err}") from err
    print(f"[runner] tables: {', '.join(shown(path.parent / n) for n in tables.OUTPUTS)}")
    bad = _warn_unreadable(path)
    if bad:
        raise ReportError(f"{len(bad)} file(s) under {args.reports} could not be read (see the "
                          "warnings); the tables were written from the others")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from gate_residual_matrix.runner.compare_reports.command import run_compare

    return run_compare(args)


def _cmd_gpu_host(args: argparse.Namespace) -> int:
    from gate_residual_matrix.runner.gpu_host.command import run

    return run(args)


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, run the command, return the exit code."""
    try:
        with signals_interrupt():
            args = _parser().parse_args(argv)
            commands = {"matrix": _cmd_matrix, "cell": _cmd_cell, "build": _cmd_build,
                        "base-image": _cmd_base_image, "report": _cmd_report,
                        "compare": _cmd_compare, "gpu-host": _cmd_gpu_host}
            return commands[args.command](args)
    except (MatrixError, settings.SettingError) as err:
        print(f"error: {shown(str(err))}", file=sys.stderr)
        return err.exit_code
    except Exception as err:  # a defect of ours: one line, the traceback only on request
        cell_process = (sys.argv[1:] if argv is None else argv)[:1] == ["cell"]
        if settings.get("GATE_RESIDUAL_DEBUG", strict=False) or cell_process:
            raise  # a cell's traceback goes to its report's log tail, not to a user
        first = (str(err).strip().splitlines() or [""])[0][:300]
        print(f"error: internal error ({type(err).__name__}: {first}); please report it, "
              "with GATE_RESIDUAL_DEBUG=1 for the traceback", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:  # Interrupted (SIGINT, SIGTERM) or Python's own Ctrl-C
        stop = err if isinstance(err, Interrupted) else Interrupted(signal.SIGINT)
        print(f"error: interrupted by {stop.signal_name}: the reports written so far are "
              "whole; run again to finish (cells whose report is current are not run again)",
              file=sys.stderr)
        return stop.exit_code


if __name__ == "__main__":
    sys.exit(main())
