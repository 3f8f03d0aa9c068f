"""One op's benchmark: its matrix's rows timed as peers, case by case, against the copy floor.

:class:`OpBench` loads the op's matrix file (:data:`runner.config.matrices.DEFAULT_MATRICES`),
makes its peers (:mod:`bench.peers`) and, per case (dtype, N), builds the inputs
(:mod:`bench.cases`), calls each peer once untimed (a peer whose call raises is a row with the
error; one that writes its inputs gets copies of its own), then times every peer and the copy
of the op's bytes in interleaved rounds (:mod:`bench.rounds`). :meth:`OpBench.document` is the
JSON written to ``<out>/<op>.json`` (docs/performance.md, "The benchmark"): per row the
medians, percentiles, ``*_copy_fraction`` (the copy's time for the same bytes over the
row's: 1.0 is copy speed), ``*_vs_fastest`` (the case's fastest peer's time over the row's)
and ``*_vs_baseline`` (the matrix baseline's time over the row's; > 1: faster).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gate_residual_matrix import ops
from gate_residual_matrix.bench.cases import bytes_moved, clone_sets, input_sets, l2_bytes
from gate_residual_matrix.bench.peers import COPY, Peer, Skipped, copy_peer, peers
from gate_residual_matrix.bench.rounds import MODES, time_peers

DTYPE_ORDER = {"bfloat16": 0, "float16": 1, "float32": 2}


@dataclass(frozen=True)
class Settings:
    """How a run times: where, which cases, how many calls, which rows."""

    device: str
    dtypes: tuple[str, ...]
    ns: tuple[int, ...]
    iters: int
    warmup: int
    rounds: int
    only: tuple[str, ...] | None = None
    skip: tuple[str, ...] = ()
    compile: bool = True


def matrix_of(op: str):
    """``(path, matrix)``: the default matrix file of ``op``
    (:data:`runner.config.matrices.DEFAULT_MATRICES`, relative to the working directory,
    else to the project root), loaded and validated once per process; ConfigError where no
    file runs ``op`` or one does not validate."""
    from gate_residual_matrix.runner.config.matrices import DEFAULT_MATRICES
    from gate_residual_matrix.runner.errors import ConfigError

    for path in DEFAULT_MATRICES:
        found, matrix = _load(path)
        if matrix.op == op:
            return found, matrix
    raise ConfigError(f"--op {op}: no default matrix file runs it "
                      f"({', '.join(map(str, DEFAULT_MATRICES))})")


@functools.cache
def _load(path: Path):
    from gate_residual_matrix.runner.cell import catalog
    from gate_residual_matrix.runner.config.matrix import load_matrix

    found = path if path.exists() else Path(__file__).resolve().parents[2] / path
    return found, load_matrix(found, known_implementations=catalog.known)


@dataclass
class OpBench:
    """The benchmark of one op, built up case by case (module docstring)."""

    op: str
    settings: Settings
    environment: dict
    path: Path = field(init=False)
    matrix: Any = field(init=False)
    table: list[Peer] = field(init=False)
    skipped: list[Skipped] = field(init=False)
    rows: list[dict] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    not_run: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        s = self.settings
        self.spec = ops.get(self.op)
        self.path, self.matrix = matrix_of(self.op)
        self.table, self.skipped = peers(self.op, self.matrix, s.device, only=s.only,
                                         skip=s.skip, compile=s.compile)

    def case(self, dtype: str, n: int) -> None:
        """Time every peer and the copy on one case; its rows are added to :attr:`rows`."""
        s = self.settings
        sets = input_sets(self.spec, self.matrix, n, dtype, s.device, l2=l2_bytes(s.device))
        moved = bytes_moved(self.spec, self.matrix, n, dtype)
        head = {"op": self.op, "dtype": dtype, "N": n, **self.matrix.problem.sizes}
        rows: dict[str, dict] = {}
        ready = [copy_peer(moved, s.device, len(sets))]
        for peer in self.table:
            if not peer.takes(dtype):
                rows[peer.name] = {"not_run": f"takes {', '.join(peer.dtypes or ())} only"}
                continue
            started = time.perf_counter()
            probed, error = probe(peer, sets)
            self._add_seconds(peer.name, time.perf_counter() - started)
            if error:
                rows[peer.name] = {"error": error}
            else:
                ready.append(probed)
        timed = time_peers(ready, sets, s.device, iters=s.iters, warmup=s.warmup,
                           rounds=s.rounds, seconds=self.seconds)
        for peer, result in zip(ready, timed, strict=True):
            extra = ({"forward_bytes": moved[0], "forward_backward_bytes": moved[1]}
                     if peer.name == COPY else {})
            mutates = {"mutates": list(peer.mutates)} if peer.mutates else {}
            rows[peer.name] = {"sets": len(sets), **extra, **mutates, **result}
        order = [COPY] + [p.name for p in self.table]  # the copy, then the matrix's order
        self.rows += [{**head, "impl": name, **rows[name]} for name in order if name in rows]
        del sets, ready
        if s.device == "cuda":
            torch.cuda.empty_cache()

    def _add_seconds(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def document(self, *, complete: bool) -> dict:
        """The run so far as the JSON document (module docstring)."""
        s = self.settings
        rows = sorted((dict(r) for r in self.rows),
                      key=lambda r: (DTYPE_ORDER.get(r["dtype"], 3), r["N"]))
        ratios(rows, self.matrix.baseline)
        env = self.environment
        project = env.get("project") or {}
        where = env.get("gpu") or env.get("cpu") or s.device
        return {"title": f"{self.op} benchmark ({where})", "op": self.op, "device": s.device,
                "commit": project.get("commit"), "dirty": project.get("dirty"),
                "complete": complete, "cases_not_run": list(self.not_run),
                "matrix": self.path.name, "baseline": self.matrix.baseline,
                "problem": self.matrix.problem.as_report(), "bytes": list(self.spec.notes[:1]),
                "copy_GBps": copy_gbps(rows), "iters": s.iters, "warmup": s.warmup,
                "rounds": s.rounds, "launch_api": launch_api(), "environment": env,
                "seconds_per_peer": {k: round(v, 3) for k, v in self.seconds.items()},
                "peers": [{"name": p.name, "ran": p.ran, "dtypes": p.dtypes,
                           "backward": p.forward_backward is not None} for p in self.table],
                "skipped": [dataclasses.asdict(k) for k in self.skipped],
                "rows": rows}


def probe(peer: Peer, sets: list[dict]) -> tuple[Peer, str | None]:
    """One untimed forward of ``peer`` on clones of the first set (as the matrix cell calls
    it: :func:`runner.cell.case.call`): ``(peer, None)``, the peer with copies of the sets
    of its own where the call wrote an input, or ``(peer, "Type: first line")`` where it
    raised."""
    from gate_residual_matrix.runner.cell.case import call, one_line

    try:
        _, changed = call(peer.impl, sets[0], backward=False)
    except Exception as err:  # one peer's failure is a row, not the end of the run
        return peer, one_line(err, 300)
    if changed:
        return dataclasses.replace(peer, sets=clone_sets(sets), mutates=tuple(changed)), None
    return peer, None


def ratios(rows: list[dict], baseline: str) -> None:
    """Add, in place, each timed row's ``<mode>_copy_fraction``, ``<mode>_vs_fastest`` (not
    the copy's) and ``<mode>_vs_baseline``, per case (dtype, N) and mode."""
    cases: dict[tuple, list[dict]] = {}
    for r in rows:
        cases.setdefault((r["dtype"], r["N"]), []).append(r)
    for case in cases.values():
        copy = next((r for r in case if r["impl"] == COPY), {})
        base = next((r for r in case if r["impl"] == baseline), {})
        for mode in MODES:
            key = f"{mode}_ms"
            timed = [r for r in case if r.get(key)]
            best = min((r[key] for r in timed if r["impl"] != COPY), default=None)
            for r in timed:
                if copy.get(key):
                    r[f"{mode}_copy_fraction"] = copy[key] / r[key]
                if best is not None and r["impl"] != COPY:
                    r[f"{mode}_vs_fastest"] = best / r[key]
                if base.get(key):
                    r[f"{mode}_vs_baseline"] = base[key] / r[key]


def copy_gbps(rows: list[dict]) -> float | None:
    """The copy bandwidth (bytes read + written per second, in GB/s) of the run's largest
    copy, or None before any copy ran."""
    best = None
    for r in rows:
        if r["impl"] != COPY:
            continue
        for mode in MODES:
            nbytes, ms = r.get(f"{mode}_bytes"), r.get(f"{mode}_ms")
            if nbytes and ms and (best is None or nbytes > best[0]):
                best = (nbytes, ms)
    return None if best is None else best[0] / (best[1] * 1e-3) / 1e9


def launch_api() -> str:
    """How our numba.cuda kernels were launched in this process (:mod:`kernels.launch`:
    "not loaded" where no kernel of ours launched, so it is not imported for this)."""
    launch = sys.modules.get("gate_residual_matrix.kernels.launch")
    DRIVER = getattr(launch, "DRIVER", None)
    if not DRIVER or "ex" not in DRIVER:
        return "not loaded"
    return "cuLaunchKernelEx" if DRIVER["ex"] is not None else "cuLaunchKernel"


def plan(settings: Settings) -> list[tuple[str, int]]:
    """The cases, in the order run: every dtype at each N, N in the order given."""
    return [(dtype, n) for n in settings.ns for dtype in settings.dtypes]


__all__ = ["OpBench", "Settings", "copy_gbps", "launch_api", "matrix_of", "plan", "probe",
           "ratios"]
