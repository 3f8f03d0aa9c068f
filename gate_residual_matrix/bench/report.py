"""The benchmark's files: ``<out>/<op>.json`` (:meth:`bench.run.OpBench.document`) and its
Markdown table ``<out>/<op>.md`` (:func:`markdown`)."""

from __future__ import annotations

import json
from pathlib import Path

from gate_residual_matrix.bench.rounds import split_iters


def _ms(v) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) else "—"


def _x(v) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) else "—"


def _pct(v) -> str:
    return f"{100 * v:.0f}%" if isinstance(v, (int, float)) else "—"


def _method(doc: dict) -> str:
    shares = sorted(set(split_iters(doc["iters"], doc["rounds"])), reverse=True)
    clock = "CUDA events" if doc["device"] == "cuda" else "perf_counter (CPU rehearsal)"
    return (f"Median ms of {clock} around each call of the row's `run` (as the matrix cell "
            f"calls it), in {doc['rounds']} interleaved rounds per case: in each, every peer "
            f"in turn gets {doc['warmup']} warm-up and {' or '.join(map(str, shares))} timed "
            "calls, round r starting at peer r mod P; each figure the median of the peer's "
            f"{doc['iters']} samples (25th and 75th percentiles in the JSON). `copy`: a device "
            "copy of the bytes the op must move, timed with the peers; % copy: the copy's "
            "time over the row's; x fastest: the case's fastest peer's time over the row's; "
            f"x {doc['baseline']}: the baseline's time over the row's (> 1: faster).")


def markdown(doc: dict) -> str:
    """The run as Markdown: how it was timed, one table row per peer and case, then the
    peers' code paths and the rows not timed with the reason."""
    env = doc["environment"]
    libs = env.get("libraries") or {}
    copy = doc.get("copy_GBps")
    base = doc["baseline"]
    lines = [f"# {doc['title']}", "",
             f"Commit {doc.get('commit') or 'unknown'}{' (dirty tree)' if doc.get('dirty') else ''}"
             f"; torch {env.get('torch')}, triton {libs.get('triton')}, numba-cuda "
             f"{libs.get('numba-cuda')}; {env.get('gpu') or 'CPU'}; problem "
             f"{', '.join(f'{k} = {v}' for k, v in doc['problem'].items())}; copy bandwidth "
             + (f"{copy:.4g} GB/s (read + write)" if copy else "not measured") + ".", "",
             _method(doc), "", *(f"Bytes: {b}" for b in doc.get("bytes", [])), "",
             "| dtype | N | impl | fwd ms | fwd % copy | fwd x fastest | fwd x " + base
             + " | fwd+bwd ms | fwd+bwd % copy | fwd+bwd x fastest | fwd+bwd x " + base + " |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in doc["rows"]:
        note = r.get("error") or r.get("not_run")
        name = r["impl"] + (f" ({'error: ' if 'error' in r else ''}{note})" if note else "")
        cells = [_ms(r.get("forward_ms")), _pct(r.get("forward_copy_fraction")),
                 _x(r.get("forward_vs_fastest")), _x(r.get("forward_vs_baseline")),
                 _ms(r.get("forward_backward_ms")),
                 _pct(r.get("forward_backward_copy_fraction")),
                 _x(r.get("forward_backward_vs_fastest")),
                 _x(r.get("forward_backward_vs_baseline"))]
        lines.append(f"| {r['dtype']} | {r['N']} | {name} | " + " | ".join(cells) + " |")
    if not doc.get("complete", True):
        lines += ["", "**Incomplete run**" + (f": cases not run: {', '.join(doc['cases_not_run'])}"
                                              if doc.get("cases_not_run") else ".")]
    lines += ["", "## Peers", ""]
    lines += [f"- **{p['name']}**: {p['ran']}" for p in doc["peers"]]
    if doc.get("skipped"):
        lines += ["", "## Not timed", ""]
        lines += [f"- **{k['name']}**: {k['reason']}" for k in doc["skipped"]]
    return "\n".join(lines) + "\n"


def write(doc: dict, out: Path) -> Path:
    """Write ``<out>/<op>.json`` and ``<out>/<op>.md`` (``out`` made if missing); returns the
    JSON's path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{doc['op']}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    path.with_suffix(".md").write_text(markdown(doc), encoding="utf-8")
    return path


__all__ = ["markdown", "write"]
