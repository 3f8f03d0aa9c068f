"""Expand the matrix into cells and select some of them (stage 2 of the pipeline).

A cell is one (stack, mode, target); it runs every selected case with every
implementation and writes one report, ``reports/<cell id>.json``.

Example::

    >>> from gate_residual_matrix.runner.config.matrix import load_matrix
    >>> m = load_matrix("matrix.yaml")
    >>> [c.id for c in select(expand(m), targets=["cpu"])]
    ['host-plain-cpu']
    >>> [c.id for c in select_cases(m, ["257-specials"])]
    ['257-specials']
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from gate_residual_matrix.runner.config.matrix import Case, Matrix
from gate_residual_matrix.runner.errors import SelectionError

__all__ = ["CHOICES_SHOWN", "Cell", "cases_on", "choices_text", "expand", "select", "select_cases"]


@dataclass(frozen=True)
class Cell:
    """One cell of the matrix: a stack name, a mode name and a target (``cuda`` or ``cpu``);
    ``prefix``: the op's :attr:`~ops.spec.OpSpec.cell_prefix`, so that two ops' cells never
    share an id.

    Example::

        >>> Cell("host", "plain", "cuda").id
        'host-plain-cuda'
        >>> Cell("host", "plain", "cpu", "scale_shift-").id
        'scale_shift-host-plain-cpu'
    """

    stack: str
    mode: str
    target: str
    prefix: str = ""

    @property
    def id(self) -> str:
        """``<prefix><stack>-<mode>-<target>``: the report's file name; unique within a
        matrix, and across ops."""
        return f"{self.prefix}{self.stack}-{self.mode}-{self.target}"


def expand(matrix: Matrix) -> tuple[Cell, ...]:
    """Every cell of ``matrix``: stacks x modes x targets, each in file order, stack outermost;
    a mode with ``targets`` has cells on those targets only.

    Example::

        >>> from gate_residual_matrix.runner.config.matrix import load_matrix
        >>> [c.id for c in expand(load_matrix("matrix.yaml"))][:3]
        ['host-plain-cuda', 'host-plain-cpu', 'host-deterministic-cuda']
    """
    from gate_residual_matrix import ops
    prefix = ops.get(matrix.op).cell_prefix
    return tuple(Cell(stack, mode, target, prefix)
                 for stack in matrix.stacks for mode, spec in matrix.modes.items()
                 for target in matrix.targets if spec.runs_on(target))


def cases_on(cases: Iterable[Case], target: str) -> tuple[Case, ...]:
    """The ``cases`` that cells of ``target`` run (a case's ``targets``), in their order.

    Example::

        >>> from gate_residual_matrix.runner.config.matrix import load_matrix
        >>> m = load_matrix("matrix.yaml")
        >>> len(cases_on(m.cases, "cuda")), len(cases_on(m.cases, "cpu"))
        (30, 20)
    """
    return tuple(c for c in cases if c.runs_on(target))


def select(cells: Iterable[Cell], *, stacks: Collection[str] | None = None,
           modes: Collection[str] | None = None,
           targets: Collection[str] | None = None) -> tuple[Cell, ...]:
    """The ``cells`` whose stack, mode and target are among those named, in their order.

    ``None`` leaves that dimension unfiltered; a plain string counts as one name.
    Raises SelectionError when a name is not one of the cells' values (the message lists
    those) or when nothing is left.

    Example::

        >>> from gate_residual_matrix.runner.config.matrix import load_matrix
        >>> select(expand(load_matrix("matrix.yaml")), targets=["gpu"])
        Traceback (most recent call last):
        runner.errors.SelectionError: --target: unknown target "gpu"; choose from cuda, cpu
    """
    cells = tuple(cells)
    wanted = {"stack": stacks, "mode": modes, "target": targets}
    for field, names in wanted.items():
        if names is not None:
            wanted[field] = _check_names(field, names, [getattr(c, field) for c in cells])
    chosen = tuple(c for c in cells
                   if all(names is None or getattr(c, field) in names
                          for field, names in wanted.items()))
    if not chosen:
        asked = ", ".join(f"--{field} {' '.join(names) or '(none)'}"
                          for field, names in wanted.items() if names is not None)
        raise SelectionError(f"no cell matches {asked or 'the selection'}; "
                             + _what_there_is(cells, wanted))
    return chosen


def _what_there_is(cells: tuple[Cell, ...], wanted: dict) -> str:
    """Why a selection matched nothing: the targets each named mode and stack has cells on
    (a mode's ``targets``: tf32 is cuda only), else the cells themselves."""
    if wanted["target"] is not None:
        have = []
        for field in ("mode", "stack"):
            for name in wanted[field] or ():
                on = dict.fromkeys(c.target for c in cells if getattr(c, field) == name)
                have.append(f"{field} {name} runs on {'/'.join(on)}")
        if have:
            return "; ".join(have)
    return f"cells: {', '.join(c.id for c in cells) or 'none'}"


def select_cases(matrix: Matrix, case_ids: Iterable[str | int] | None = None,
                 ) -> tuple[Case, ...]:
    """The cases of ``matrix`` whose ids (``"257"``, ``"257-specials"``) are named, in file order.

    ``None`` selects every case; an int ``257`` is taken as ``"257"``. Raises
    SelectionError for an unknown id (listing the known ones) or an empty selection.

    Example::

        >>> from gate_residual_matrix.runner.config.matrix import load_matrix
        >>> [c.n for c in select_cases(load_matrix("matrix.yaml"), ["1", "4097"])]
        [1, 4097]
    """
    if case_ids is None:
        return matrix.cases
    names = _check_names("case", case_ids, [c.id for c in matrix.cases])
    chosen = tuple(c for c in matrix.cases if c.id in names)
    if not chosen:
        raise SelectionError("--case: no case selected; choose from "
                             + choices_text("case", [c.id for c in matrix.cases]))
    return chosen


def _as_names(names: Iterable[str | int] | str) -> list[str | int]:
    return [names] if isinstance(names, (str, int)) else list(names)


def _check_names(field: str, names: Iterable[str | int] | str,
                 allowed: Iterable[str]) -> tuple[str, ...]:
    """``names`` as a tuple; SelectionError for the first one not in ``allowed``."""
    choices = tuple(dict.fromkeys(allowed))  # unique, first-seen order
    names = tuple(str(n) for n in _as_names(names))
    for name in names:
        if name not in choices:
            raise SelectionError(f"--{field}: unknown {field} {_quote(name)}; "
                                 f"choose from {choices_text(field, choices)}")
    return names


CHOICES_SHOWN = 10
"""How many valid values an unknown-name error lists before "... (N more; ...)"."""


def choices_text(field: str, choices: Sequence[str]) -> str:
    """``choices`` joined for a one-line error, the first :data:`CHOICES_SHOWN` only, then
    where the rest are (``field``: the matrix file's key without its "s"). Example::

        >>> choices_text("case", [str(n) for n in range(12)])
        "0, 1, 2, 3, 4, 5, 6, 7, 8, 9 ... (2 more; see matrix.yaml's cases)"
    """
    shown = ", ".join(choices[:CHOICES_SHOWN]) or "nothing"
    rest = len(choices) - CHOICES_SHOWN
    return shown + (f" ... ({rest} more; see matrix.yaml's {field}s)" if rest > 0 else "")


def _quote(name: str) -> str:
    """A user's name in double quotes, escaped so the message stays one line."""
    return '"' + name.encode("unicode_escape").decode("ascii").replace('"', '\\"') + '"'
