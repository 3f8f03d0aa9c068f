"""Command line: ``python -m runner {matrix,cell,report} ...`` (what the nox sessions call).

Every :class:`runner.errors.MatrixError` is caught here, printed as one line on stderr and
mapped to its exit code (config 2, report 3, backend 4, failed cells 5).

Examples::

    python -m runner matrix --target cpu --case 257
    python -m runner report
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runner.errors import CellsFailed, ConfigError, MatrixError

DEFAULT_MATRIX = Path("matrix.yaml")
DEFAULT_REPORTS = Path("reports")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors become ConfigError (exit 2)
        raise ConfigError(f"{self.prog}: {message}")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m runner", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def selection(p):
        p.add_argument("--matrix", type=Path, default=DEFAULT_MATRIX, help="matrix.yaml path")
        p.add_argument("--reports", type=Path, default=DEFAULT_REPORTS, help="report directory")
        p.add_argument("--stack", action="append", help="run only this stack (repeatable)")
        p.add_argument("--mode", action="append", help="run only this mode (repeatable)")
        p.add_argument("--target", action="append", help="cuda or cpu (repeatable)")
        p.add_argument("--case", action="append", help='case id, e.g. 257 or "257-specials"')

    m = sub.add_parser("matrix", help="run the selected cells, write reports and tables")
    selection(m)
    m.add_argument("--backend", default="host", help="host (docker arrives with containers)")
    m.add_argument("--force", action="store_true", help="re-run cells whose report is current")
    m.add_argument("--timeout", type=float, default=3600.0, help="seconds per cell")

    c = sub.add_parser("cell", help="run one cell in this process (used by the backends)")
    selection(c)
    c.add_argument("--run-id", default="", help="written into the report")
    c.add_argument("--no-timings", action="store_true", help="skip the timing loops")

    r = sub.add_parser("report", help="render reports/README.md from every report")
    r.add_argument("--reports", type=Path, default=DEFAULT_REPORTS)
    return parser


def _cmd_matrix(args) -> int:
    from runner import run

    outcomes = run.run_matrix(args.matrix, reports_dir=args.reports, stacks=args.stack,
                              modes=args.mode, targets=args.target, cases=args.case,
                              backend=args.backend, force=args.force, timeout_s=args.timeout)
    print(run.summary(outcomes))
    print(f"[runner] tables: {args.reports / 'README.md'}")
    bad = run.failed(outcomes)
    if bad:
        raise CellsFailed(f"{len(bad)} of {len(outcomes)} cells did not end ok: "
                          + ", ".join(f"{o.cell} ({o.status})" for o in bad))
    return 0


def _cmd_cell(args) -> int:
    from runner import report as report_io
    from runner.cell import run_cell
    from runner.cells import expand, select, select_cases
    from runner.config import load_matrix

    matrix = load_matrix(args.matrix)
    cells = select(expand(matrix), stacks=args.stack, modes=args.mode, targets=args.target)
    if len(cells) != 1:
        raise ConfigError(f"cell: the selection matches {len(cells)} cells; name one stack, "
                          "mode and target")
    report = run_cell(matrix, cells[0], select_cases(matrix, args.case), run_id=args.run_id,
                      timings=not args.no_timings)
    path = report_io.write_report(report, args.reports)
    print(f"[runner] {cells[0].id}: {report['status']} -> {path}")
    return 0


def _cmd_report(args) -> int:
    from runner import tables

    path = tables.write_tables(args.reports)
    print(f"[runner] tables: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, run the command, return the exit code."""
    try:
        args = _parser().parse_args(argv)
        return {"matrix": _cmd_matrix, "cell": _cmd_cell, "report": _cmd_report}[args.command](args)
    except MatrixError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
