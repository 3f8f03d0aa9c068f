"""Pictures of the tables as static SVG (matplotlib): accuracy vs N, bits that differ, bench.

:func:`render_plots` returns ``{file name: SVG text}`` for ``reports/plots/``; the Markdown
links them and the HTML page embeds them. Three kinds:

* ``accuracy-<gpu>.svg``: per GPU (or CPU), one panel per tensor, the error against fp64 in
  ULPs of the storage dtype (``results[impl].accuracy[case][tensor].max_abs_ulps``) against N
  (``inputs[case].n``), log-log, one line per implementation: the largest error over that
  GPU's cells and dtypes at each N. Cases with special values are left out (their error is
  ``inf``); an error of 0 is drawn at :data:`FLOOR`.
* ``bits-differ.svg``: the headline as colours: per pair (row) and GPU × stack × mode (column),
  green where every tensor has the same bits, red by the largest fraction of elements that
  differ, grey where the pair was not compared.
* ``bench-<file>.svg``: each ``reports/bench/*.json`` with rows of ``N``, ``dtype``, ``D``,
  ``forward_ms`` (and ``forward_backward_ms``): time against N per implementation for its
  first dtype, with the bandwidth floor, the bytes the op must move (the ``bytes_moved`` of
  the file's ``op``; files without one are the first op's, :mod:`ops`) over the file's
  ``copy_GBps``.

The SVG is deterministic (fixed hash salt, no date, text kept as text), so rendering twice
gives the same bytes.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from gate_residual_matrix import ops
from gate_residual_matrix.runner.reports import tensors as report_tensors
from gate_residual_matrix.runner.tables.model.cases import ITEMSIZE, case_dtypes
from gate_residual_matrix.runner.tables.model.cells import CellReport
from gate_residual_matrix.runner.tables.model.headline import Headline
from gate_residual_matrix.runner.tables.model.values import ABSENT

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["FLOOR", "MAX_MARKERS", "render_plots"]

FLOOR = 1e-2
"""Where an error of 0 ULP is drawn on the log scale."""
_CASE_N = re.compile(r"^([0-9]+)(?:-(?:bfloat16|float16|float32)-int(?:32|64))?$")
_MAX_TICKS = 60
MAX_MARKERS = 200
"""A series of more points is drawn as a line without a marker per point: 20,000 markers
per line took 3 s to draw into an SVG of megabytes, and overlap into a smear anyway."""
_SLUG = re.compile(r"[^a-z0-9]+")


def slug(value: str) -> str:
    """A file-name part: ``NVIDIA H200`` -> ``nvidia-h200``."""
    return _SLUG.sub("-", value.lower()).strip("-") or "none"


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    # no layout engine: constrained layout triples the time of a figure with log axes
    return Figure(figsize=(width, height))


def _svg(fig: Figure) -> str:
    import matplotlib
    from matplotlib.ticker import NullLocator

    for ax in fig.axes:  # minor ticks on log axes cost three quarters of the drawing time
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_minor_locator(NullLocator())

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "gate-residual", "svg.fonttype": "none",
                                "font.size": 9}):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def _n_of(cell: CellReport, case: str) -> int | None:
    n = ((cell.data.get("inputs") or {}).get(case) or {}).get("n")
    if _count(n):
        return n if "specials" not in case else None
    m = _CASE_N.match(case)
    return int(m.group(1)) if m else None


def _ulps(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past float's range
        return None
    return max(number, FLOOR) if number == number and number != float("inf") else None


def accuracy_series(
        cells: Sequence[CellReport]) -> dict[str, dict[str, dict[str, dict[int, float]]]]:
    """gpu -> tensor label -> implementation -> N -> the largest error in ULPs over the cells
    (an implementation of an op other than the first named ``<impl> (<op>)``)."""
    out: dict[str, dict[str, dict[str, dict[int, float]]]] = {}
    for cell in cells:
        gpu = "CPU" if cell.target == "cpu" else (cell.gpu or ABSENT)
        names = report_tensors.labels(cell.data)
        for impl, entry in cell.results.items():
            if not isinstance(entry, Mapping) or entry.get("role") == "accuracy_reference":
                continue
            if cell.op not in (None, ops.OPS[0]):
                impl = f"{impl} ({cell.op})"
            for case, acc in (entry.get("accuracy") or {}).items():
                n = _n_of(cell, case)
                if n is None or not isinstance(acc, Mapping) or case_dtypes(cell, case)[0] is None:
                    continue
                figures = report_tensors.flat(acc)
                for tensor, name in names.items():
                    ulps = _ulps((figures.get(tensor) or {}).get("max_abs_ulps"))
                    if ulps is None:
                        continue
                    series = out.setdefault(gpu, {}).setdefault(name, {}).setdefault(impl, {})
                    series[n] = max(series.get(n, 0.0), ulps)
    return out


def _accuracy_figure(gpu: str, by_tensor: dict[str, dict[str, dict[int, float]]]) -> Figure:
    tensors = list(by_tensor)
    fig = _figure(11 * max(1, len(tensors)) / 4, 3.6)
    axes = fig.subplots(1, len(tensors), sharey=True, squeeze=False)[0]
    impls = list(dict.fromkeys(i for t in by_tensor.values() for i in t))
    for ax, tensor in zip(axes, tensors, strict=True):
        for n, impl in enumerate(impls):
            series = by_tensor.get(tensor, {}).get(impl)
            if not series:
                continue
            xs = sorted(series)
            marker = "o" if len(xs) <= MAX_MARKERS else None  # a line alone past that
            ax.plot(xs, [series[x] for x in xs], marker=marker, markersize=3, linewidth=1,
                    color=f"C{n % 10}", linestyle=("-", "--", ":", "-.")[n // 10 % 4],
                    label=impl)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(tensor)
        ax.set_xlabel("N (rows)")
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel("error vs fp64 (ULPs of the dtype)")
    fig.suptitle(f"{gpu}: largest error against fp64 over cells and dtypes (0 drawn at "
                 f"{FLOOR:g})", fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    ncol = min(max(len(labels), 1), 5)
    legend_in = 0.16 * -(-len(labels) // ncol)
    fig.set_size_inches(11, 3.0 + legend_in)
    height = 3.0 + legend_in
    fig.subplots_adjust(left=0.07, right=0.99, top=1 - 0.45 / height,
                        bottom=(0.5 + legend_in) / height, wspace=0.08)
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=7, frameon=False)
    return fig


def _bits_figure(h: Headline) -> Figure:
    from matplotlib import colormaps  # not pyplot: importing it costs half a second
    from matplotlib.colors import to_rgb

    reds = colormaps["Reds"]
    rows, cols = len(h.pairs), len(h.columns)
    grid = []
    for pair in h.pairs:
        line = []
        for n in range(cols):
            mark = h.marks.get((pair, n))
            if mark is None or not mark.compared:
                line.append(to_rgb("#d0d7de"))
            elif mark.equal:
                line.append(to_rgb("#2da44e"))
            else:
                line.append(reds(0.35 + 0.65 * min(mark.worst(), 1.0))[:3])
        grid.append(line)
    labels = [f"{c.gpu.removeprefix('NVIDIA ')} · {c.stack.split(' (')[0]} · {c.mode}"
              for c in h.columns]
    left_in = 0.5 + 0.055 * max(map(len, h.pairs))
    bottom_in = 0.3 + 0.045 * max(map(len, labels))
    width = min(left_in + 0.3 + 0.22 * cols, 16)
    height = bottom_in + 0.8 + 0.2 * rows
    fig = _figure(width, height)
    fig.subplots_adjust(left=left_in / width, right=1 - 0.2 / width, bottom=bottom_in / height,
                        top=1 - 0.7 / height)
    ax = fig.subplots()
    ax.imshow(grid, aspect="auto", interpolation="nearest")
    ax.set_yticks(range(rows), h.pairs, fontsize=7)
    step = max(1, -(-cols // _MAX_TICKS))
    ax.set_xticks(range(0, cols, step), labels[::step], rotation=90, fontsize=6)
    ax.set_title("green: same bits\nred: bits differ (darker: more)\ngrey: not compared",
                 fontsize=7, loc="left")
    return fig


def _count(value: Any) -> TypeGuard[int]:
    """A positive int that is not a bool (N, D, G of a bench row)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**53


def _time(value: Any) -> TypeGuard[float]:
    """A finite positive number (a time in ms, a bandwidth) that a log axis can show."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and 0 < value < float("inf"))


def _bench_figure(title: str, doc: Mapping[str, Any]) -> Figure | None:
    given = doc.get("rows")
    rows = [r for r in given if isinstance(r, Mapping) and _count(r.get("N"))
            and _time(r.get("forward_ms"))] if isinstance(given, list) else []
    if not rows:
        return None
    dtype = rows[0].get("dtype")
    rows = [r for r in rows if r.get("dtype") == dtype]
    copy = doc.get("copy_GBps")
    fig = _figure(9, 3.6)
    axes = fig.subplots(1, 2, sharey=True)
    impls = list(dict.fromkeys(str(r.get("impl")) for r in rows))
    for ax, key, idx in ((axes[0], "forward_ms", 0), (axes[1], "forward_backward_ms", 1)):
        for n, impl in enumerate(impls):
            points = sorted((r["N"], r[key]) for r in rows if str(r.get("impl")) == impl
                            and _time(r.get(key)))
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", markersize=3, linewidth=1,
                        color=f"C{n % 10}", label=impl)
        size = ITEMSIZE.get(str(dtype))
        first = rows[0]
        op = doc.get("op")  # benchmark files from before the generic bench: the first op's
        spec = ops.get(op if op in ops.OPS else ops.OPS[0])
        sizes = {k: first[k] for k in spec.sizes if _count(first.get(k))}
        if _time(copy) and size and len(sizes) == len(spec.sizes):
            ns = sorted({r["N"] for r in rows})
            floor = [spec.bytes_moved(n, sizes, size)[idx] / (copy * 1e6) for n in ns]
            ax.plot(ns, floor, color="black", linewidth=1.5, linestyle="--",
                    label=f"bandwidth floor ({copy:.0f} GB/s copy)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("N (rows)")
        ax.set_title(key.replace("_ms", "").replace("_", " + "))
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("median time (ms)")
    fig.suptitle(f"{title} ({dtype})")
    handles, labels = axes[0].get_legend_handles_labels()
    for h, lab in zip(*axes[1].get_legend_handles_labels(), strict=True):
        if lab not in labels:
            handles.append(h)
            labels.append(lab)
    fig.subplots_adjust(left=0.08, right=0.66, top=0.86, bottom=0.14, wspace=0.06)
    fig.legend(handles, labels, loc="center right", fontsize=6, frameon=False)
    return fig


def render_plots(cells: Sequence[CellReport], h: Headline,
                 bench_dir: Path | None = None) -> dict[str, tuple[str, str]]:
    """``{file name: (title, SVG text)}`` in a fixed order: accuracy per GPU, bits, bench.

    Bench files that are not JSON objects with rows are skipped here (the tables list them
    as unreadable). Raises nothing for odd report values: they are left out of the series.
    Without matplotlib (``pip install -e '.[report]'``) there are no pictures: ``{}``.

    Example:
        >>> sorted(render_plots(cells, headline(cells)))[:1]
        ['accuracy-cpu.svg']
    """
    out: dict[str, tuple[str, str]] = {}
    try:
        import matplotlib  # noqa: F401  (the `report` extra)
    except ImportError:
        return out  # the tables say so: no pictures without matplotlib
    if h.columns:
        out["bits-differ.svg"] = ("Bits that differ, per pair across GPUs, stacks and modes",
                                  _svg(_bits_figure(h)))
    for gpu, by_tensor in sorted(accuracy_series(cells).items(),
                                 key=lambda kv: (kv[0] == "CPU", kv[0])):
        name = f"accuracy-{slug(gpu)}.svg"
        out[name] = (f"Error against fp64 vs N, {gpu}", _svg(_accuracy_figure(gpu, by_tensor)))
    if bench_dir is not None and bench_dir.is_dir():
        for path in sorted(bench_dir.glob("*.json")):
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if not isinstance(doc, Mapping):
                continue
            title = str(doc.get("title") or path.stem)
            fig = _bench_figure(title, doc)
            if fig is not None:
                out[f"bench-{slug(path.stem)}.svg"] = (f"Benchmark time vs N: {title}",
                                                       _svg(fig))
    return out
