"""The matrix run: load config → expand cells → select → run cells → reports → tables.

Each step is a function of :mod:`runner.config`, :mod:`runner.cells`, a backend and
:mod:`runner.report` / :mod:`runner.tables`; this module only strings them together, decides
which cells can run here (a ``cuda`` cell on a host without a GPU is ``skipped`` with the
reason, never a missing file) and which need not run again (same fingerprint, status ok).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

from runner import implementations, tables
from runner import report as report_io
from runner.backends import BACKENDS, DockerBackend, resolve, route
from runner.cell import fingerprint, skeleton
from runner.cells import Cell, expand, select, select_cases
from runner.config import load_matrix
from runner.environment import project_state, uncommitted_digest
from runner.errors import ConfigError

DEFAULT_TIMEOUT_S = 3600.0


def cuda_available() -> bool:
    """Whether torch sees a CUDA device here (no CUDA context is created)."""
    import torch

    return torch.cuda.is_available()


@dataclass(frozen=True)
class CellOutcome:
    """One row of the run summary."""

    cell: str
    status: str
    reason: str | None
    path: Path
    reused: bool = False


def _fingerprint_extra(backend, matrix, cell) -> dict:
    """What the backend adds to a cell's fingerprint (a docker image id); {} if nothing."""
    extra = getattr(backend, "fingerprint_extra", None)
    return dict(extra(matrix, cell)) if extra else {}


def _write_skipped(skipped: dict, path: Path, reports_dir: Path) -> str:
    """Write a ``skipped`` report unless ``path`` already holds a readable report with
    results (say, the H200 cell committed from another machine): a host that cannot run a
    cell must not erase what a host that could run it measured. Returns the reason shown."""
    if path.exists():
        existing = report_io.read_report(path)
        if existing.data and existing.data.get("status") not in (None, "skipped"):
            return (f"{skipped['reason']}; kept the existing {existing.data['status']} report "
                    f"({(existing.data.get('environment') or {}).get('gpu') or 'no GPU'}, "
                    f"{existing.data.get('finished_at', '?')})")
    report_io.write_report(skipped, reports_dir)
    return skipped["reason"]


def _reusable(path: Path, expected_fingerprint: str) -> bool:
    if not path.exists():
        return False
    loaded = report_io.read_report(path)
    return bool(loaded.data and loaded.data.get("status") == "ok"
                and loaded.data.get("fingerprint") == expected_fingerprint)


def run_matrix(matrix_path: Path, *, reports_dir: Path, stacks: Sequence[str] | None = None,
               modes: Sequence[str] | None = None, targets: Sequence[str] | None = None,
               cases: Sequence[str] | None = None, backend: str = "host", force: bool = False,
               timeout_s: float = DEFAULT_TIMEOUT_S, render: bool = True,
               gpus: str = "all", abba: str | None = None) -> list[CellOutcome]:
    """Run the selected cells and write one report per cell, then the tables.

    ``backend`` is host, docker or auto (docker when an engine answers); a cell of a
    ``kind: docker`` stack in a host run is ``skipped`` with the reason, a ``kind: host``
    stack always runs on the host (:func:`runner.backends.route`). ``gpus`` ("all" or ids
    like "0,1") is the docker backend's GPU request for ``cuda`` cells. ``abba`` (a mode
    name): each selected cell runs in A-B-B-A order against its partner in that mode
    (:mod:`runner.abba`), always (no reuse), and both cells' reports record
    ``repeatable_across_processes``; cells of mode ``abba`` itself run only as partners.

    Raises :class:`ConfigError` (nothing run or written) for a bad matrix.yaml, a selection
    that matches nothing, an explicitly requested target this host lacks, an unknown
    backend or a timeout that is not a positive number of seconds. Cells that fail are
    outcomes, not exceptions.
    """
    if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < math.inf):
        raise ConfigError(f"--timeout: expected a number of seconds > 0, got {timeout_s!r}")
    matrix_path, reports_dir = Path(matrix_path).resolve(), Path(reports_dir).resolve()
    matrix = load_matrix(matrix_path, known_implementations=implementations.KNOWN)
    made = {"docker": DockerBackend(gpus=gpus, matrix_dir=Path(matrix_path).parent)}
    chosen, note = resolve(backend, made["docker"])  # ConfigError, BackendError
    if note:
        print(f"[runner] {note}", flush=True)
    cells = select(expand(matrix), stacks=stacks, modes=modes, targets=targets)
    if abba is not None:
        if abba not in matrix.modes:
            raise ConfigError(f"--abba: expected one of the modes ({', '.join(matrix.modes)}), "
                              f"got {abba!r}")
        cells = tuple(c for c in cells if c.mode != abba)
        if not cells:
            raise ConfigError(f"--abba {abba}: the selection has no cell of another mode")
    chosen_cases = select_cases(matrix, cases)
    has_gpu = cuda_available()
    if targets and "cuda" in targets and not has_gpu:
        raise ConfigError("--target: cuda was requested but torch sees no CUDA device here")
    reports_dir.mkdir(parents=True, exist_ok=True)
    for stale in report_io.remove_stale_temp_files(reports_dir):
        print(f"[runner] removed {stale.name}: left by an interrupted write", flush=True)
    project = project_state()
    project["diff_sha256"] = uncommitted_digest() if project.get("dirty") else None
    outcomes: list[CellOutcome] = []
    for cell in cells:
        path = reports_dir / f"{cell.id}.json"
        run_id = uuid.uuid4().hex
        backend, why_not = route(matrix.stacks[cell.stack].kind, chosen)
        if why_not:
            skipped = skeleton(matrix, cell, chosen_cases, backend=chosen, run_id=run_id,
                               status="skipped", reason=why_not)
            why_not = _write_skipped(skipped, path, reports_dir)
            print(f"[runner] cell {cell.id}: skipped: {why_not}", flush=True)
            outcomes.append(CellOutcome(cell.id, "skipped", why_not, path))
            continue
        if backend not in made:
            made[backend] = BACKENDS[backend]()
        runner_backend = made[backend]
        expected = fingerprint(matrix, cell, chosen_cases, project,
                               _fingerprint_extra(runner_backend, matrix, cell))
        if cell.target == "cuda" and not has_gpu:
            skipped = skeleton(matrix, cell, chosen_cases, backend=backend, run_id=run_id,
                               status="skipped",
                               reason="target cuda: torch sees no CUDA device on this host")
            skipped["fingerprint"] = expected
            reason = _write_skipped(skipped, path, reports_dir)
            outcomes.append(CellOutcome(cell.id, "skipped", reason, path))
            continue
        if abba is not None:
            outcomes += _run_abba(runner_backend, matrix, cell, abba, chosen_cases, project,
                                  matrix_path=matrix_path, reports_dir=reports_dir,
                                  timeout_s=timeout_s)
            continue
        if not force and _reusable(path, expected):
            outcomes.append(CellOutcome(cell.id, "ok", "same fingerprint: not run again", path,
                                        reused=True))
            continue
        print(f"[runner] cell {cell.id}: running {len(chosen_cases)} case(s) on {backend}",
              flush=True)
        result = runner_backend.run(matrix, cell, chosen_cases, matrix_path=matrix_path,
                                    reports_dir=reports_dir, run_id=run_id, timeout_s=timeout_s)
        # The runner's fingerprint decides reuse; taken again after the run, so that what the
        # run made (a docker image and its id) counts as the next run will see it.
        ran_with = fingerprint(matrix, cell, chosen_cases, project,
                               _fingerprint_extra(runner_backend, matrix, cell))
        if result.get("fingerprint") != ran_with:
            result = {**result, "fingerprint": ran_with}
            report_io.write_report(result, reports_dir)
        outcomes.append(CellOutcome(cell.id, result["status"], result.get("reason"), path))
    if render:
        tables.write_tables(reports_dir)
    return outcomes


def _run_abba(backend, matrix, cell, mode_b: str, cases, project, *, matrix_path: Path,
              reports_dir: Path, timeout_s: float) -> list[CellOutcome]:
    """Cell and partner in A-B-B-A order; both merged reports written; their outcomes."""
    from runner import abba

    print(f"[runner] cell {cell.id}: A-B-B-A against mode {mode_b}", flush=True)
    merged = abba.run_abba(backend, matrix, cell, mode_b, cases, matrix_path=matrix_path,
                           reports_dir=reports_dir, timeout_s=timeout_s)
    outcomes = []
    for report in merged:
        one = Cell(report["cell"]["stack"], report["cell"]["mode"], report["cell"]["target"])
        report["fingerprint"] = fingerprint(matrix, one, cases, project,
                                            _fingerprint_extra(backend, matrix, one))
        path = report_io.write_report(report, reports_dir)
        outcomes.append(CellOutcome(one.id, report["status"], report.get("reason"), path))
    return outcomes


def summary(outcomes: Sequence[CellOutcome]) -> str:
    """A plain-text table of the run's cells: id, status, reason."""
    rows = [(o.cell, o.status + (" (reused)" if o.reused else ""), o.reason or "")
            for o in outcomes]
    return tabulate(rows, headers=("cell", "status", "reason"), tablefmt="simple")


def failed(outcomes: Sequence[CellOutcome]) -> list[CellOutcome]:
    """Outcomes whose status is neither ok nor skipped."""
    return [o for o in outcomes if o.status not in ("ok", "skipped")]
