"""The matrix run, as the README tells it: load → expand → select → run each cell → write →
render.

:func:`run_matrix` is that list of named steps, each a typed function below that can be
tested alone:

1. :func:`load`: the options checked and matrix.yaml parsed (nothing run or written
   before the matrix and every option are good: exit 2);
2. :func:`choose_site`: where the cells run, one site of
   :data:`runner.backends.sites.SITES` (:class:`runner.backends.site.Site`): this machine's
   backends (``--backend host|docker|auto``) or a Ray cluster (``--cluster``), connected
   (``site.open()``) once the selection is made;
3. :func:`select`: the cells (:func:`runner.plan.cells.expand`, then ``--stack/--mode/--target``
   and ``--abba``) and the cases (``--case``);
4. :func:`check_site`: the selected cases fit in memory, a requested ``cuda`` target has a
   GPU;
5. :func:`prepare`: which docker stacks cannot run here, named once (the site's
   ``prepare``: with ``--build`` the missing images are built first);
6. :func:`open_reports`: the reports directory, what stopped runs left in it, the
   project's state that every fingerprint takes;
7. :func:`runner.run.run_cells`: each cell skipped, reused, refused or submitted to the site,
   which runs them, and its report written;
8. :func:`render_tables`: the tables (:mod:`runner.tables`).

A cell that fails is an outcome, not an exception: :class:`runner.outcome.CellOutcome`.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gate_residual_matrix.runner import tables
from gate_residual_matrix.runner.backends.docker.container import gpu_request
from gate_residual_matrix.runner.backends.site import Site, SiteOptions
from gate_residual_matrix.runner.backends.sites import SITES, site_name
from gate_residual_matrix.runner.cell import catalog as implementations
from gate_residual_matrix.runner.cell.environment import project_state, uncommitted_digest
from gate_residual_matrix.runner.config.matrix import Case, Matrix, read_matrix
from gate_residual_matrix.runner.config.paths import output_folder
from gate_residual_matrix.runner.errors import ConfigError, ReportError
from gate_residual_matrix.runner.outcome import CellOutcome
from gate_residual_matrix.runner.plan.case_sizes import check_case_sizes
from gate_residual_matrix.runner.plan.cells import Cell, cases_on, expand, select_cases
from gate_residual_matrix.runner.plan.cells import select as select_cells
from gate_residual_matrix.runner.reports import store as report_io
from gate_residual_matrix.runner.run import STACK_SKIPPED, RunContext, run_cells, salvage_stale

__all__ = ["STACK_SKIPPED", "Request", "Selection", "Site", "check_site", "choose_site", "load",
           "open_reports", "prepare", "render_tables", "run_cells", "run_matrix", "select",
           "snapshot_matrix"]

DEFAULT_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class Request:
    """What a ``matrix`` command asks for: its options (see :func:`run_matrix`)."""

    matrix_path: Path
    reports_dir: Path
    stacks: Sequence[str] | None = None
    modes: Sequence[str] | None = None
    targets: Sequence[str] | None = None
    cases: Sequence[str] | None = None
    backend: str = "host"
    force: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S
    render: bool = True
    gpus: str = "all"
    abba: str | None = None
    build: bool = False
    cluster: str | None = None
    gpu_model: str | None = None
    retries: int = 2
    snapshot: bytes | None = None
    """The matrix file's bytes as :func:`load` validated them (the cells run from a copy of
    these, never from the file again)."""


@dataclass(frozen=True)
class Selection:
    """The selected cells and cases; ``partial``: fewer cases than the matrix has (their
    results are merged into each cell's existing report)."""

    cells: tuple[Cell, ...]
    cases: tuple[Case, ...]
    partial: bool


def run_matrix(matrix_path: Path, *, reports_dir: Path, stacks: Sequence[str] | None = None,
               modes: Sequence[str] | None = None, targets: Sequence[str] | None = None,
               cases: Sequence[str] | None = None, backend: str = "host", force: bool = False,
               timeout_s: float = DEFAULT_TIMEOUT_S, render: bool = True,
               gpus: str = "all", abba: str | None = None, build: bool = False,
               cluster: str | None = None, gpu_model: str | None = None,
               retries: int = 2) -> list[CellOutcome]:
    """Run the selected cells and write one report per cell, then the tables.

    ``backend`` is host, docker or auto (docker when an engine answers); a cell of a
    ``kind: docker`` stack in a host run is ``skipped`` with the reason, a ``kind: host``
    stack always runs on the host (:func:`runner.backends.registry.route`). No image is built unless
    ``build`` (``--build``: the missing ones first, before any cell): under ``auto`` a
    docker stack without its image, or lacking what its build needs (base image,
    wheelhouse, CA bundle), is ``skipped``, and the skipped stacks are named once with the
    command that builds them (:func:`prepare`); under ``docker`` a missing image is a
    :class:`BackendError` before anything runs, and a stack lacking anything else ends
    ``build_error``. ``gpus`` ("all" or ids like "0,1") is the docker backend's GPU request
    for ``cuda`` cells. ``cases`` naming fewer than all the cases is a partial run: its
    cases are merged into each cell's existing report (:func:`runner.reports.merge.plan_partial`).
    ``abba`` (a mode name): each selected cell runs in A-B-B-A order against its partner
    in that mode (:mod:`runner.plan.abba`), always (no reuse), and both cells' reports record
    ``repeatable_across_processes``; cells of mode ``abba`` itself run only as partners.
    ``cluster`` (a Ray address, :mod:`runner.backends.ray.cluster`): the cells that must run go
    to the cluster's nodes at once, each needing ``gpu_model``'s resource when given, each
    retried ``retries`` times where its node dies; their reports come back here and are
    written as here.

    Raises :class:`ConfigError` (nothing run or written) for a bad matrix.yaml, a selection
    that matches nothing, an explicitly requested target this host lacks, an unknown
    backend, a malformed ``gpus``, a timeout that is not a positive number of seconds or a
    selected case too big for this host's memory (:func:`check_case_sizes`);
    :class:`ReportError` when a report cannot be written. Cells that fail are outcomes,
    not exceptions.

    Example::

        >>> run_matrix(Path("matrix.yaml"), reports_dir=Path("reports"), targets=["cpu"],
        ...            cases=["1"])  # doctest: +SKIP
        [CellOutcome(cell='host-plain-cpu', status=<Status.OK: 'ok'>, ...)]
    """
    request, matrix = load(Request(
        Path(matrix_path), Path(reports_dir), stacks=stacks, modes=modes, targets=targets,
        cases=cases, backend=backend, force=force, timeout_s=timeout_s, render=render,
        gpus=gpus, abba=abba, build=build, cluster=cluster, gpu_model=gpu_model,
        retries=retries))
    site = choose_site(request)
    selection = select(matrix, request)
    site.open()
    ctx = None
    try:
        check_site(matrix, selection, site, request)
        skipped = prepare(matrix, selection, site, request)
        ctx = open_reports(matrix, selection, request)
        outcomes = run_cells(ctx, selection.cells, site, skipped, partial=selection.partial,
                             abba=request.abba)
    finally:
        site.close()
        if ctx is not None and ctx.matrix_path != request.matrix_path:
            shutil.rmtree(ctx.matrix_path.parent, ignore_errors=True)
    if request.render:
        render_tables(request.reports_dir)
    return outcomes


def load(request: Request) -> tuple[Request, Matrix]:
    """Step 1: the options that need no matrix checked, the paths resolved, the matrix
    parsed and validated (:func:`runner.config.matrix.load_matrix`) and ``--gpus`` checked.

    Raises:
        ConfigError: a timeout that is not a positive number of seconds, a path that cannot
            be resolved, a reports folder that is a file or a project's root
            (:func:`runner.config.paths.output_folder`), a bad matrix file or a malformed
            ``--gpus``.
    """
    timeout_s = request.timeout_s
    if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < math.inf):
        raise ConfigError(f"--timeout: expected a number of seconds > 0, got {timeout_s!r}")
    output_folder(request.reports_dir, "--reports")
    try:
        request = replace(request, matrix_path=request.matrix_path.resolve(),
                          reports_dir=request.reports_dir.resolve())
    except (OSError, RuntimeError) as err:  # a symlink loop
        raise ConfigError(f"--matrix/--reports: cannot resolve the path: {err}") from err
    matrix, snapshot = read_matrix(request.matrix_path,
                                   known_implementations=implementations.known)
    gpu_request(request.gpus)  # a malformed --gpus is exit 2 whichever backend runs
    return replace(request, snapshot=snapshot), matrix


def choose_site(request: Request) -> Site:
    """Step 2: where the cells run, a site of :data:`runner.backends.sites.SITES`: this
    machine's backends (``--backend``: ``auto`` asks the Docker engine), or a cluster's
    nodes (``--cluster``), which it connects to only after :func:`select` (``open()``).

    Raises:
        ConfigError: an unknown backend, ``--abba`` with ``--cluster``, ``--gpu-model``
            without it.
        BackendError: ``--backend docker`` and no engine answers.
    """
    options = SiteOptions(backend=request.backend, gpus=request.gpus,
                          matrix_dir=request.matrix_path.parent, build=request.build,
                          abba=request.abba, cluster=request.cluster,
                          gpu_model=request.gpu_model, retries=request.retries)
    return SITES[site_name(options)](options)


def select(matrix: Matrix, request: Request) -> Selection:
    """Step 3: the cells (:func:`runner.plan.cells.expand` then ``--stack``, ``--mode``,
    ``--target``; with ``--abba`` its partner mode's cells run only as partners) and the
    cases (``--case``).

    Raises:
        ConfigError: a selection that matches nothing, an ``--abba`` mode that is not in
            the matrix or has no cell on a selected target, cases of which none runs on a
            selected target.
    """
    cells = select_cells(expand(matrix), stacks=request.stacks, modes=request.modes,
                         targets=request.targets)
    abba = request.abba
    if abba is not None:
        if abba not in matrix.modes:
            raise ConfigError(f"--abba: expected one of the modes ({', '.join(matrix.modes)}), "
                              f"got {abba!r}")
        cells = tuple(c for c in cells if c.mode != abba)
        if not cells:
            raise ConfigError(f"--abba {abba}: the selection has no cell of another mode")
        partnerless = sorted({c.target for c in cells}
                             - {t for t in matrix.targets if matrix.modes[abba].runs_on(t)})
        if partnerless:
            raise ConfigError(f"--abba {abba}: mode {abba} has no cells on target "
                              f"{', '.join(partnerless)}; select another target with --target")
    cases = tuple(select_cases(matrix, request.cases))
    if request.cases and not any(cases_on(cases, c.target) for c in cells):
        raise ConfigError(f"--case: no selected case runs on target "
                          f"{', '.join(sorted({c.target for c in cells}))} (each case's "
                          f"targets: {request.matrix_path.name})")
    return Selection(cells, cases, len(cases) < len(matrix.cases))


def check_site(matrix: Matrix, selection: Selection, site: Site, request: Request) -> None:
    """Step 4: every selected case fits in the memory a cell has at the site (this host's;
    a cluster's largest node's: :func:`runner.plan.case_sizes.check_case_sizes`), and a
    requested ``cuda`` target has a GPU there (cells no node of a cluster can run are
    skipped later). Sets ``site.has_gpu``.

    Raises:
        ConfigError: a case too big, or ``--target cuda`` where torch sees no GPU.
    """
    check_case_sizes(matrix, selection.cases, request.matrix_path, site.memory_bytes())
    site.has_gpu = site.gpu_available()
    if request.targets and "cuda" in request.targets and not site.has_gpu:
        raise ConfigError("--target: cuda was requested but torch sees no CUDA device here")


def prepare(matrix: Matrix, selection: Selection, site: Site,
            request: Request) -> dict[str, str]:
    """Step 5: which docker stacks of the cells that can run are skipped, ``{stack:
    reason}``, named once here (``[runner] skipped docker stack(s) a, b: ...``) before any
    cell runs (the site's ``prepare``: on the host backend every docker stack; on the
    docker backend those without an image, never built without ``--build``, which builds
    the missing ones here; on a cluster each node says so for its cells).

    Raises:
        BackendError: ``--backend docker`` and a stack has no image (nothing runs).
    """
    if site.note:
        print(f"[runner] {site.note}", flush=True)
    return site.prepare(matrix, selection.cells, strict=request.backend == "docker")


def open_reports(matrix: Matrix, selection: Selection, request: Request) -> RunContext:
    """Step 6: the reports directory made, the temporary files of interrupted writes and
    the staging directories of runs that died cleaned up (their partial reports kept), and
    what every cell of this run shares: :class:`runner.run.RunContext` (the project's state
    included).

    Raises:
        ReportError: the reports directory cannot be made.
    """
    reports_dir = request.reports_dir
    try:
        reports_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ReportError(f"{reports_dir}: cannot create the reports directory: "
                          f"{err.strerror or err}") from err
    for stale in report_io.remove_stale_temp_files(reports_dir):
        print(f"[runner] removed {stale.name}: left by an interrupted write", flush=True)
    project: dict[str, Any] = project_state()
    project["diff_sha256"] = uncommitted_digest() if project.get("dirty") else None
    salvage_stale(reports_dir, matrix)
    return RunContext(matrix, snapshot_matrix(request), reports_dir, selection.cases, project,
                      force=request.force, timeout_s=request.timeout_s,
                      matrix_origin=request.matrix_path)


def snapshot_matrix(request: Request) -> Path:
    """The file the cells read the matrix from: a private copy (same name, in a new
    temporary folder that :func:`run_matrix` removes) of the bytes :func:`load` validated,
    so that editing the matrix file while the run goes on changes nothing in it; the file
    itself when there is no snapshot (a request not made by :func:`load`).

    Raises:
        ReportError: the temporary folder cannot be written.

    Example::

        >>> request, matrix = load(Request(Path("matrix.yaml"), Path("reports")))  # doctest: +SKIP
        >>> snapshot_matrix(request)  # doctest: +SKIP
        PosixPath('/tmp/gate-residual-matrix-k2j4/matrix.yaml')
    """
    if request.snapshot is None:
        return request.matrix_path
    try:
        folder = Path(tempfile.mkdtemp(prefix="gate-residual-matrix-"))
        path = folder / request.matrix_path.name
        path.write_bytes(request.snapshot)
        path.chmod(0o444)
    except OSError as err:
        raise ReportError(f"cannot write the matrix snapshot the cells read: "
                          f"{err.strerror or err}") from err
    return path


def render_tables(reports_dir: Path) -> Path:
    """Step 8: the tables from every report under ``reports_dir``
    (:func:`runner.tables.write_tables`); returns the README's path.

    Raises:
        ReportError: a table cannot be written.
    """
    try:
        return tables.write_tables(reports_dir)
    except OSError as err:
        raise ReportError(f"{reports_dir}: cannot write the tables: "
                          f"{err.strerror or err}") from err
