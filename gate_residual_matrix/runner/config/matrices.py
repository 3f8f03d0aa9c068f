"""The main job's matrix files, one per op, and what a selection keeps of each.

``nox -s matrix`` runs every op: :data:`DEFAULT_MATRICES` (one file per op, each validated as
``matrix.yaml`` is). ``--op`` keeps the files of those ops; ``--stack``, ``--mode`` and
``--case`` name values of any of the files: a value one file lacks is dropped for that file,
and a file left with none of the named values of a dimension is not run. A value no file has
is refused by the first file's run, listing its values (:class:`runner.errors.ConfigError`).

Example::

    >>> [r.path.name for r in plan([Path("matrix.yaml")], ops=None, stacks=None,
    ...                             modes=["plain"], cases=None)]
    ['matrix.yaml']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gate_residual_matrix.runner.errors import ConfigError

DEFAULT_MATRICES: tuple[Path, ...] = (
    Path("matrix.yaml"), Path("matrix-scale-shift.yaml"), Path("matrix-rms-norm.yaml"),
    Path("matrix-add-rms-norm.yaml"), Path("matrix-rms-norm-scale-shift.yaml"))
"""Every op's matrix file, in the order the tables list the ops (:data:`ops.OPS`)."""


@dataclass(frozen=True)
class Run:
    """One matrix file to run, with the selection values that apply to it (None: all)."""

    path: Path
    op: str
    stacks: tuple[str, ...] | None
    modes: tuple[str, ...] | None
    cases: tuple[str, ...] | None


def _ids(matrix) -> dict[str, set[str]]:
    return {"stack": set(matrix.stacks), "mode": set(matrix.modes),
            "case": {c.id for c in matrix.cases}}


def plan(paths: Sequence[Path], *, ops: Sequence[str] | None, stacks: Sequence[str] | None,
         modes: Sequence[str] | None, cases: Sequence[str] | None) -> list[Run]:
    """The files to run and each one's selection (see the module docstring).

    Raises ConfigError for a file that does not validate or an ``--op`` no file runs. A
    stack, mode or case that no selected file has leaves the first file alone, with every
    value as given: its run refuses the selection in its own words.
    """
    from gate_residual_matrix.runner.cell import catalog as implementations
    from gate_residual_matrix.runner.config.matrix import load_matrix

    loaded = [(Path(p), load_matrix(p, known_implementations=implementations.known))
              for p in paths]
    if ops:
        found = {m.op for _, m in loaded}
        unknown = [o for o in ops if o not in found]
        if unknown:
            raise ConfigError(f"--op: unknown op {unknown[0]!r}; choose from "
                              f"{', '.join(m.op for _, m in loaded)}")
        loaded = [(p, m) for p, m in loaded if m.op in ops]
    wanted = {"stack": stacks, "mode": modes, "case": cases}
    for dim, values in wanted.items():
        every = set().union(*(_ids(m)[dim] for _, m in loaded))
        if any(value not in every for value in values or ()):
            # no file has it: the first file's own selection says so, with its choices
            path, matrix = loaded[0]
            return [Run(path, matrix.op, *(None if v is None else tuple(v)
                                           for v in wanted.values()))]
    runs = []
    for path, matrix in loaded:
        ids = _ids(matrix)
        kept = {dim: None if values is None else tuple(v for v in values if v in ids[dim])
                for dim, values in wanted.items()}
        if any(v == () for v in kept.values()):
            continue
        runs.append(Run(path, matrix.op, kept["stack"], kept["mode"], kept["case"]))
    if not runs:
        raise ConfigError("the selection matches no cell of any matrix file "
                          f"({', '.join(str(p) for p, _ in loaded)})")
    return runs
