"""The tables about each cell as a whole: what it is, its status, environment, what did not run.

* :func:`cells_table`: every readable report with its status and reason, where its time went,
  its project commit and file.
* :func:`environment_table`: versions (GPU, driver, CUDA, Python, torch, libraries) and image.
* :func:`implementations_table`: implementations that did not run, with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gate_residual_matrix.runner.tables.model.cases import cell_dtypes
from gate_residual_matrix.runner.tables.model.cells import CellReport, image_of
from gate_residual_matrix.runner.tables.model.filters import Filters
from gate_residual_matrix.runner.tables.model.table import Row, Table
from gate_residual_matrix.runner.tables.model.values import ABSENT, num, short, status_kind
from gate_residual_matrix.runner.untrusted.names import shown

__all__ = ["LIBRARIES", "cells_table", "environment_table", "implementations_table",
           "shown_path", "time_spent"]

LIBRARIES = ("triton", "vllm", "sglang", "diffusers", "numba-cuda")
"""Library versions in the environment table (besides torch), from ``environment.libraries``."""

_SHORT_COMMIT = 12
_SHORT_DIGEST = 12


def shown_path(path: Path, relative_to: Path | None) -> str:
    """``path`` as the tables show it: relative to ``relative_to`` (the outputs' directory)
    where it lies below it, else as given; bytes that are not UTF-8 and control characters
    escaped (:func:`runner.untrusted.names.shown`)."""
    if relative_to is not None:
        try:
            # the folder resolved, not the file: a symlink is shown by its own name
            here = path.parent.resolve() / path.name
            return shown(here.relative_to(Path(relative_to).resolve()).as_posix())
        except (ValueError, RuntimeError, OSError):  # RuntimeError: a symlink loop
            pass
    return shown(path.as_posix())


def _commit(cell: CellReport) -> str:
    project = cell.environment.get("project") or {}
    commit, dirty = project.get("commit"), project.get("dirty")
    if commit is None and not cell.ours:
        # The reference report names its project's commit at the top, e.g. rl_kernel_commit.
        commit = next((v for k, v in cell.data.items()
                       if k.endswith("_commit") and isinstance(v, str)), None)
        dirty = cell.data.get("tracked_tree_dirty")
    if not commit:
        return ABSENT
    return str(commit)[:_SHORT_COMMIT] + (" (dirty)" if dirty else "")


def time_spent(data: dict, top: int = 3) -> str:
    """``"98 s: compile 41, batch inv. 20, inputs 9"``: a report's wall time and its
    largest phases in seconds (``phases``, runner/cell/phases.py); the total alone without them,
    ``—`` without either. ``compile``, ``GPU wait`` and ``memory wait`` are parts of the others
    (compiling, waiting for the GPU lock, waiting for GPU memory)."""
    total = data.get("duration_s")
    if not isinstance(total, (int, float)):
        return ABSENT
    phases = data.get("phases")
    if not isinstance(phases, dict):
        return f"{total:.0f} s"
    spent = {k: v for k, v in phases.items() if isinstance(v, (int, float)) and v > 0
             and k not in ("other", "gpu_exclusive", "gpu_lock_set_aside")}  # parts of others
    for part in ("runs", "gpu_lock_wait"):
        values = phases.get(part)
        if isinstance(values, dict):  # a lock wait's drain and long are parts of exclusive
            spent[part] = sum(v for k, v in values.items()
                              if isinstance(v, (int, float)) and k not in ("drain", "long"))
    names = {"compilation": "compile", "batch_invariance": "batch inv.",
             "comparisons": "compare", "gpu_lock_wait": "GPU wait",
             "gpu_memory_wait": "memory wait"}
    biggest = sorted(spent.items(), key=lambda kv: -kv[1])[:top]
    return f"{total:.0f} s: " + ", ".join(f"{names.get(k, k)} {v:.0f}" for k, v in biggest)


def cells_table(cells: Sequence[CellReport], relative_to: Path | None = None) -> Table:
    """One row per readable report: what it is, its status and reason, where its time went,
    commit and file."""
    rows = [Row((c.label, c.origin, c.facet("stack"), c.facet("mode"), c.facet("target"),
                 ", ".join(cell_dtypes(c)) or ABSENT, c.status, short(c.reason or ABSENT),
                 time_spent(c.data), _commit(c), shown_path(c.report.path, relative_to)), c.index,
                ("", "", "", "", "", "", status_kind(c.status)))
            for c in cells]
    return Table("cells", "Cells", ("cell", "origin", "stack", "mode", "target", "dtypes",
                                    "status", "reason", "time", "project commit", "file"), rows,
                 note="Every readable report, whatever its status; `foreign`: another "
                      "project's report (the reference layout), read where it can be. "
                      "`dtypes`: the storage dtypes of the cell's cases. `time`: the cell's "
                      "wall time and its three largest phases in seconds (report `phases`; "
                      "`compile`, `GPU wait` and `memory wait` are the parts of the others "
                      "spent compiling, waiting for other cells' GPU work and waiting for "
                      "GPU memory, `runs` the implementations' repeated calls).",
                 empty="No reports.")


def _digest(digest: str | None) -> str:
    if not digest:
        return ABSENT
    algo, _, hexpart = digest.rpartition("@")[2].rpartition(":")
    return (f"{algo}:" if algo else "") + hexpart[:_SHORT_DIGEST]


def environment_table(cells: Sequence[CellReport]) -> Table:
    """Per cell: GPU, capability, driver, CUDA, Python, torch, libraries, image, status."""
    rows = []
    for c in cells:
        env = c.environment
        libs = env.get("libraries") or {}
        cap = env.get("capability")
        tag, digest = image_of(c.data)
        rows.append(Row((c.label, c.status, c.facet("gpu"),
                         ".".join(map(str, cap)) if cap else ABSENT,
                         *(num(env.get(k)) for k in ("driver", "cuda", "python", "torch")),
                         *(num(libs.get(k)) for k in LIBRARIES), num(tag), _digest(digest)),
                        c.index, ("", status_kind(c.status))))
    return Table("environment", "Environment",
                 ("cell", "status", "GPU", "capability", "driver", "CUDA", "Python", "torch",
                  *LIBRARIES, "image", "digest or id"), rows,
                 note="Versions as the cell saw them (`—`: not installed or not recorded); "
                      "image tag and digest for cells run in a container.",
                 empty="No reports.")


def implementations_table(cells: Sequence[CellReport], filters: Filters | None = None) -> Table:
    """Implementations whose status is not ok, with the reason."""
    filters = filters or Filters()
    rows = [Row((c.label, impl, str(e.get("status")), short(e.get("reason") or ABSENT)),
                c.index, ("", "", status_kind(str(e.get("status")))))
            for c in cells for impl, e in c.results.items()
            if e.get("status") not in (None, "ok") and filters.keeps_impl(impl)]
    return Table("implementations", "Implementations that did not run",
                 ("cell", "impl", "status", "reason"), rows,
                 empty="Every implementation in every cell ran (status ok or not recorded).",
                 level=3)
