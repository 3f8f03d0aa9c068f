"""Write the outputs: read the reports, build the tables once, render every format, and write
each file atomically where it changed.

:func:`write_tables` is the last stage of the pipeline (``python -m gate_residual_matrix
report`` and the end of ``python -m gate_residual_matrix matrix``). It writes :data:`OUTPUTS`
(``README.md``, ``index.html``,
``summary.csv``, ``summary.json``), the Markdown pages (``cells/``, ``ab.md``) and the pictures
(``plots/*.svg``): each format of :data:`runner.tables.formats.FORMATS`, or those a caller
names. The outputs are a pure function of the reports and the current commit (no
timestamps), so regenerating them changes nothing.
"""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from gate_residual_matrix import settings
from gate_residual_matrix.runner.reports.store import read_reports, write_text_atomic
from gate_residual_matrix.runner.tables.formats import Rendering, select
from gate_residual_matrix.runner.tables.model.build import build_tables
from gate_residual_matrix.runner.tables.model.filters import Filters
from gate_residual_matrix.runner.tables.model.headline import choose_level
from gate_residual_matrix.runner.tables.render import html, plots

__all__ = ["OUTPUTS", "current_commit", "write_tables"]

OUTPUTS = ("README.md", "index.html", "summary.csv", "summary.json")
"""The files :func:`write_tables` writes, in one directory."""

_ROOT = Path(__file__).resolve().parents[3]


def current_commit(root: Path = _ROOT) -> str | None:
    """The project's git HEAD (``GATE_RESIDUAL_COMMIT`` overrides it, as for the reports),
    or None where git or the checkout is missing. Never raises."""
    if settings.get("GATE_RESIDUAL_COMMIT"):
        return settings.get("GATE_RESIDUAL_COMMIT")
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _write_if_changed(path: Path, text: str, durable: bool = True) -> None:
    """Write ``text`` atomically unless ``path`` already holds exactly it (a thousand cell
    pages are rewritten only where they changed). ``durable=False``: renamed into place
    without fsync (pages and pictures that the next run rewrites: a thousand fsyncs took
    5 s on the CPU machine); readers still see the old or the new file, whole."""
    data = text.encode("utf-8")
    try:
        if path.read_bytes() == data:
            return
    except OSError:
        pass
    if durable:
        write_text_atomic(path, text)
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _sweep(directory: Path, suffix: str, keep: set[str]) -> None:
    """Remove this tool's earlier outputs (``*<suffix>`` files) that it no longer writes."""
    if directory.is_dir() and not directory.is_symlink():
        for path in directory.glob(f"*{suffix}"):
            if path.name not in keep and path.is_file() and not path.is_symlink():
                path.unlink()


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (as it was after). The tables
    make millions of short-lived rows beside a parsed report of millions of values, and each
    full collection walks them all: 6 of 41 s for a 20,000-case report. What they make has no
    reference cycles to find; reference counting frees it as before."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def write_tables(reports_dir: Path, out: Path | None = None, *, filters: Filters | None = None,
                 ab: Sequence[tuple[str, str]] | None = None,
                 head: str | bool | None = True, formats: Iterable[str] | None = None) -> Path:
    """Read every report under ``reports_dir`` and write the outputs atomically.

    Writes, next to ``out``: the Markdown (``README.md``: the headline first), ``index.html``,
    ``summary.csv``, ``summary.json``, ``cells/README.md`` and ``cells/<cell>.md`` (one page
    per cell), ``ab.md`` (when an A/B is shown) and ``plots/*.svg``; earlier pages and
    plots this run no longer writes are removed from ``cells/`` and ``plots/``.

    Args:
        reports_dir: the reports directory (read recursively; ``bench/*.json`` as benchmarks;
            the ``summary.json`` this function writes is not read as a report).
        out: the Markdown file; ``<reports_dir>/README.md`` when None.
        filters, ab: as for :func:`~runner.tables.model.build.build_tables`.
        head: the current commit for staleness marks; True (default) asks git
            (:func:`current_commit`), None means unknown.
        formats: the names of the formats to write (:data:`runner.tables.formats.FORMATS`:
            markdown, html, csv, json, plots); every one when None.

    Returns:
        The Markdown path written.
    Raises:
        ReportError: ``reports_dir`` is not a directory (bad files never raise: they are
            listed under "Unreadable files").
        SelectionError: a filter value or ``--ab`` name no report has, or an unknown format;
            nothing is written.

    Example:
        >>> write_tables(Path("reports"))
        PosixPath('reports/README.md')
    """
    with _gc_paused():
        return _write_tables(Path(reports_dir), out, filters=filters, ab=ab, head=head,
                             formats=formats)


def _write_tables(reports_dir: Path, out: Path | None, *, filters: Filters | None,
                  ab: Sequence[tuple[str, str]] | None, head: str | bool | None,
                  formats: Iterable[str] | None) -> Path:
    """:func:`write_tables`'s work."""
    chosen = select(formats)
    reports_dir = Path(reports_dir)
    out = reports_dir / OUTPUTS[0] if out is None else Path(out)
    # this tool's outputs, next to ``out`` and in the reports directory, are never reports
    ours = {os.path.realpath(d / name) for d in (out.parent, reports_dir) for name in OUTPUTS}
    # realpath, not Path.resolve: a symlink loop named *.json is a bad file, not a crash
    reports = read_reports(reports_dir, skip=ours)
    tables = build_tables(reports, relative_to=out.parent, filters=filters, ab=ab,
                          bench_dir=reports_dir / "bench",
                          head=current_commit() if head is True else head or None)
    headline = choose_level(tables.cells, tables, html.HTML_MARKS)
    figures = plots.render_plots(tables.cells, headline, reports_dir / "bench")
    rendering = Rendering(tables=tables, figures=figures, headline=headline, out=out)
    written = {f.name: f.render(rendering) for f in chosen}
    for f in chosen:
        if f.folder:
            (out.parent / f.folder).mkdir(parents=True, exist_ok=True)
    main = {out, *(out.parent / name for name in OUTPUTS[1:])}
    for texts in written.values():
        for path, text in texts.items():
            _write_if_changed(path, text, durable=path in main)
    for f in chosen:
        if f.folder and f.sweep:
            folder = out.parent / f.folder
            _sweep(folder, f.sweep, {p.name for p in written[f.name] if p.parent == folder})
        for path in f.stale(rendering):
            if path.is_file():
                path.unlink()
    return out
