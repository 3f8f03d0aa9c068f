"""Load and validate matrix.yaml into frozen, typed objects (stage 1 of the pipeline).

Parse once, at the boundary: unknown keys, wrong types and bad values are errors, and
each becomes one :class:`~runner.errors.ConfigError` with a one-line message,
``<file>: <key path>: expected <what>, got <what was found>``, e.g.
``matrix.yaml: cases[2].n: expected an integer >= 1, got 0``. Reading the file is
:mod:`runner.config.yaml_file`'s (bounded size, depth, aliases, integers; no duplicate key);
turning pydantic's errors into that line is :mod:`runner.config.errors`'s.

Example::

    >>> m = load_matrix("matrix.yaml")
    >>> [c.id for c in m.cases][4:6], m.baseline, list(m.modes)[:2]
    (['257-specials', '1-bfloat16-int32'], 'eager', ['plain', 'deterministic'])
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from gate_residual_matrix.runner.config.errors import (
    _describe,
    _one_line,
    _one_of,
    _path,
    _show,
)
from gate_residual_matrix.runner.config.sections import (
    DTYPES,
    INDEX_DTYPES,
    LIBRARY_DISTRIBUTIONS,
    TARGETS,
    DockerStack,
    DType,
    FrozenMap,
    HostStack,
    IndexDType,
    Libraries,
    ListOf,
    Mode,
    Name,
    NonEmptyMapOf,
    PipOptions,
    Stack,
    Target,
    TorchSettings,
    _Frozen,
)
from gate_residual_matrix.runner.config.yaml_file import (
    UniqueKeyLoader,
    _read_matrix_file,
    _refuse_huge_integers,
)
from gate_residual_matrix.runner.errors import ConfigError

__all__ = ["DTYPES", "INDEX_DTYPES", "LIBRARY_DISTRIBUTIONS", "PROBLEM_KEYS",
           "SCHEMA_VERSION", "TARGETS",
           "BatchInvariance", "Case", "DockerStack", "FrozenMap", "HostStack", "Libraries",
           "Matrix", "Mode",
           "PipOptions", "Problem", "Stack", "Timing", "TorchSettings", "load_matrix",
           "parse_matrix", "read_matrix"]

SCHEMA_VERSION = 1
MAX_REPEATS = 1000
"""``repeats`` at most: each repeat runs every implementation on every case once more."""
MAX_TIMING_CALLS = 100_000
"""``timing.warmup`` and ``timing.iters`` at most (per case and implementation)."""
MAX_SWEEP_SIZE = 1 << 20
"""``batch_invariance.max_size`` at most (the sweep runs once per size up to it)."""
Known = Collection[str] | Callable[[str], Collection[str]] | None
"""``known_implementations``: names, a function of the op giving them, or None (the op's)."""


PROBLEM_KEYS = ("dtype", "index_dtype", "seed")
"""The ``problem`` keys every op has; its sizes (:attr:`ops.spec.OpSpec.sizes`) are the rest."""


class Problem(BaseModel):
    """Fixed for every case: the op's sizes (its spec's ``sizes``, each an integer >= 1,
    checked against the op by :class:`Matrix`), storage/index dtypes, input ``seed``."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)

    dtype: DType
    index_dtype: IndexDType
    seed: Annotated[StrictInt, Field(ge=0, le=2**63 - 1)]

    @property
    def sizes(self) -> dict[str, int]:
        """The op's sizes, in file order (``{"D": 5376, "G": 9}``)."""
        return dict(self.model_extra or {})

    def as_report(self) -> dict[str, Any]:
        """The report's ``problem``: the sizes, then dtype, index_dtype and seed."""
        return {**self.sizes, "dtype": self.dtype, "index_dtype": self.index_dtype,
                "seed": self.seed}


class Case(_Frozen):
    """One size: ``n`` rows; ``specials`` plants NaN, +-Inf, +-0.0, subnormals, extremes;
    ``grouped`` sorts the index, so the rows that share an index value are contiguous (the
    tokens of one sample in a DiT batch), where the default draws each row's value at random.

    ``dtype`` and ``index_dtype`` override the problem's for this case; in a validated
    :class:`Matrix` both are set (the case's own pair) or both None (the problem's pair),
    whichever way the file wrote them. ``targets``: the targets whose cells run this case
    (None: every target of the matrix), for cases too slow for a CPU cell.
    """

    n: Annotated[StrictInt, Field(ge=1)]
    specials: StrictBool = False
    grouped: StrictBool = False
    dtype: DType | None = None
    index_dtype: IndexDType | None = None
    targets: ListOf[Target] | None = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, dump: Any) -> dict[str, Any]:
        # ``grouped`` only where it is set: a matrix without it keeps its content hash
        return {k: v for k, v in dump(self).items()
                if v is not None and not (k == "grouped" and v is False)}

    @property
    def base_id(self) -> str:
        """``"257"``, ``"257-specials"``, ``"257-grouped"`` or ``"257-specials-grouped"``: the
        id without the dtypes; it keys the input streams, so a case has the same values
        (rounded to its dtype) in every dtype."""
        return "-".join([str(self.n), *(["specials"] if self.specials else []),
                         *(["grouped"] if self.grouped else [])])

    @property
    def id(self) -> str:
        """This case's key in reports and ``--case``: ``"257"``, ``"257-specials"`` in the
        problem's dtypes, ``"257-float16-int32"``, ``"257-specials-float32-int64"`` in others.
        """
        return "-".join([self.base_id, *(v for v in (self.dtype, self.index_dtype) if v)])

    def runs_on(self, target: str) -> bool:
        """Whether cells of ``target`` run this case."""
        return self.targets is None or target in self.targets


class Timing(_Frozen):
    """Timing loop: ``warmup`` untimed calls, then ``iters`` timed ones (milliseconds per
    call in the report); ``targets``: the targets whose cells time (None: every target;
    a cell elsewhere records no timings)."""

    warmup: Annotated[StrictInt, Field(ge=0, le=MAX_TIMING_CALLS)] = 5
    iters: Annotated[StrictInt, Field(ge=1, le=MAX_TIMING_CALLS)] = 50
    targets: ListOf[Target] | None = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, dump: Any) -> dict[str, Any]:
        data = dump(self)
        if data.get("targets") is None:
            data.pop("targets", None)
        return data

    def runs_on(self, target: str) -> bool:
        """Whether cells on ``target`` time the implementations."""
        return self.targets is None or target in self.targets


class BatchInvariance(_Frozen):
    """Batch-invariance checks (:mod:`runner.cell.batch_invariance`), run when the key is given:
    ``max_size`` caps the size sweep and the padded batch (CPU run time); ``sizes``: row
    counts the sweep takes besides its own (e.g. 256, where a library switches kernels);
    ``forward_only``: check implementations without a backward too, on their forward
    outputs (default: only those with a backward)."""

    max_size: Annotated[StrictInt, Field(ge=1, le=MAX_SWEEP_SIZE)] = 1025
    sizes: Annotated[tuple[Annotated[StrictInt, Field(ge=1, le=MAX_SWEEP_SIZE)], ...],
                     Field(strict=False, max_length=64)] = ()
    forward_only: StrictBool = False


class Matrix(_Frozen):
    """The validated matrix; a cell (stack, mode, target) runs every case x implementation.

    Fields: ``schema_version`` (1), ``op``, ``problem``, ``cases``, ``implementations``,
    ``baseline`` (compared bitwise with all), ``accuracy_reference`` (or None), ``repeats``,
    ``timing``, ``modes`` and ``stacks`` (name -> Mode / Stack, file order), ``targets``,
    ``pip`` (image build options every docker stack starts from), ``pairs``: implementation
    pairs compared bitwise besides each one against the baseline (a versioned library row's
    name stands for each of its versions), e.g. a trainer's row against a rollout engine's.
    Lists are tuples, mappings are read-only :class:`FrozenMap`. Build one with
    :func:`load_matrix` or :func:`parse_matrix`, which raise ConfigError.

    Example::

        >>> m = load_matrix("matrix.yaml"); m.to_dict()["targets"], len(m.content_hash())
        (['cuda', 'cpu'], 64)
    """

    schema_version: StrictInt
    op: StrictStr
    problem: Problem
    cases: ListOf[Case]
    implementations: ListOf[StrictStr]
    baseline: StrictStr
    accuracy_reference: StrictStr | None = None
    repeats: Annotated[StrictInt, Field(ge=1, le=MAX_REPEATS)] = 3
    timing: Timing = Timing()
    batch_invariance: BatchInvariance | None = None
    modes: NonEmptyMapOf[Name, Mode]
    stacks: NonEmptyMapOf[Name, Stack]
    targets: ListOf[Target]
    pip: PipOptions = PipOptions()  # defaults for every docker stack's image build
    libraries: Libraries | None = None  # library versions as rows
    pairs: Annotated[tuple[Annotated[tuple[StrictStr, StrictStr], Field(strict=False)], ...],
                     Field(strict=False, max_length=64)] = ()

    @field_validator("op")
    @classmethod
    def _known_op(cls, op: str) -> str:
        """``op`` is one of :data:`ops.OPS`."""
        from gate_residual_matrix import ops
        if op not in ops.OPS:
            close = difflib.get_close_matches(op, ops.OPS, n=1)
            raise PydanticCustomError("matrix", "unknown op", {
                "expected": _one_of(list(ops.OPS)),
                "got": _show(op) + (f" (did you mean {close[0]}?)" if close else "")})
        return op

    @field_validator("problem")
    @classmethod
    def _op_sizes(cls, problem: Problem, info: ValidationInfo) -> Problem:
        """``problem`` has exactly the op's sizes (each an integer >= 1) beside
        :data:`PROBLEM_KEYS` (an unknown op's sizes are not checked: ``op`` is the error)."""
        from gate_residual_matrix import ops
        op = info.data.get("op")
        if op not in ops.OPS:
            return problem
        sizes, given = ops.get(op).sizes, problem.sizes
        found = []
        for key, value in given.items():
            if key not in sizes:
                keys = [*sizes, *PROBLEM_KEYS]
                close = difflib.get_close_matches(str(key), keys, n=1)
                found.append((key, f"one of the keys {', '.join(keys)} (op {op})",
                              f"unknown key {_show(key)}"
                              + (f" (did you mean {close[0]}?)" if close else "")))
            elif type(value) is not int or value < 1:
                found.append((key, "an integer >= 1", _show(value)))
        found += [(key, "an integer >= 1", "nothing (the key is missing)")
                  for key in sizes if key not in given]
        if found:
            key, expected, got = found[0]
            raise PydanticCustomError("matrix", "bad problem", {
                "path": _path(["problem", key]), "expected": expected, "got": got,
                "more": len(found) - 1})
        return problem

    @model_validator(mode="before")
    @classmethod
    def _resolve_case_dtypes(cls, data: Any) -> Any:
        """A case that names ``dtype`` or ``index_dtype`` gets both (the other from
        ``problem``), or neither when the pair is the problem's: one id per content."""
        if not isinstance(data, Mapping) or not isinstance(data.get("cases"), list):
            return data
        problem = data.get("problem")
        problem = problem if isinstance(problem, Mapping) else {}
        defaults = {"dtype": (problem.get("dtype"), DTYPES),
                    "index_dtype": (problem.get("index_dtype"), INDEX_DTYPES)}
        if not all(v in allowed for v, allowed in defaults.values()):
            return data  # the problem's own error is reported; cases are left as written
        cases = []
        for case in data["cases"]:
            if isinstance(case, Mapping) and any(k in case for k in defaults):
                case = {**case, **{k: v if case.get(k) is None else case[k]
                                   for k, (v, _) in defaults.items()}}
                if all(case[k] == v for k, (v, _) in defaults.items()):
                    case = {k: v for k, v in case.items() if k not in defaults}
            cases.append(case)
        return {**data, "cases": cases}

    @model_serializer(mode="wrap")
    def _drop_optional(self, dump: Any) -> dict[str, Any]:
        # an absent optional section leaves to_dict() (so content_hash) as before it existed
        data = dump(self)
        if data.get("batch_invariance") is None:
            data.pop("batch_invariance", None)
        if data.get("libraries") is None:
            data.pop("libraries", None)
        if not data.get("pairs"):
            data.pop("pairs", None)
        found = data.get("batch_invariance")
        if isinstance(found, dict):  # defaults left out: hashes as before the keys existed
            if not found.get("sizes"):
                found.pop("sizes", None)
            if not found.get("forward_only"):
                found.pop("forward_only", None)
        return data

    @field_validator("schema_version")
    @classmethod
    def _known_schema(cls, v: int) -> int:
        if v != SCHEMA_VERSION:
            newer = " (this file is newer than this runner: update the runner)"
            raise PydanticCustomError("matrix", "unknown schema version", {
                "expected": f"{SCHEMA_VERSION}{newer if v > SCHEMA_VERSION else ''}"})
        return v

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Matrix:
        known = (info.context or {}).get("known_implementations")
        if known is None:
            from gate_residual_matrix import ops
            known = ops.get(self.op).implementation_names
        problems = list(_cross_checks(self, tuple(known)))
        if problems:
            path, expected, got = problems[0]
            raise PydanticCustomError("matrix", "{path}: expected {expected}, got {got}", {
                "path": path, "expected": expected, "got": got, "more": len(problems) - 1})
        return self

    def to_dict(self) -> dict[str, Any]:
        """The validated content as plain JSON-ready data, defaults filled in, file order."""
        return self.model_dump(mode="json")

    def case_dtypes(self, case: Case) -> tuple[str, str]:
        """(storage dtype, index dtype) of ``case``: its own, else the problem's.

        Example::

            >>> m = load_matrix("matrix.yaml"); m.case_dtypes(m.cases[0])
            ('bfloat16', 'int64')
        """
        return (case.dtype or self.problem.dtype, case.index_dtype or self.problem.index_dtype)

    def content_hash(self) -> str:
        """sha256 hex of the canonical JSON of :meth:`to_dict` (sorted keys, no spaces).

        Defaults count as written; the order of keys (so of ``modes`` and ``stacks``) does
        not count, the order of lists (``cases``, ``implementations``, ``targets``) does.
        """
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def _cross_checks(m: Matrix, known: tuple[str, ...]) -> Iterator[tuple[str, str, str]]:
    """Yield (key path, expected, found) for each broken rule that spans several keys."""
    yield from _duplicates("cases", [c.id for c in m.cases], "unique case ids")
    for i, name in enumerate(m.implementations):
        if name not in known:
            yield f"implementations[{i}]", f"one of {', '.join(known)}", _show(name)
    yield from _duplicates("implementations", m.implementations, "unique names")
    for key in ("baseline", "accuracy_reference"):
        name = getattr(m, key)
        if name is not None and name not in m.implementations:
            yield key, f"one of implementations ({', '.join(m.implementations)})", _show(name)
    if m.baseline == m.accuracy_reference:
        yield "baseline", "an implementation other than accuracy_reference", _show(m.baseline)
    for i, case in enumerate(m.cases):
        if case.grouped and _op_has_no_index(m.op):
            yield f"cases[{i}].grouped", f"false: op {m.op} has no index to group", "true"
    for i, pair in enumerate(m.pairs):
        for j, name in enumerate(pair):
            if name not in m.implementations or name == m.accuracy_reference:
                yield (f"pairs[{i}][{j}]", "one of implementations other than the accuracy "
                       f"reference ({', '.join(m.implementations)})", _show(name))
        if pair[0] == pair[1]:
            yield f"pairs[{i}]", "two different implementations", _show(list(pair))
    yield from _duplicates("targets", m.targets, "unique targets")
    named = [(f"cases[{i}]", c.targets) for i, c in enumerate(m.cases)]
    named += [(f"modes.{name}", mode.targets) for name, mode in m.modes.items()]
    named.append(("timing", m.timing.targets))
    for key, targets in named:
        for j, target in enumerate(targets or ()):
            if target not in m.targets:
                yield (f"{key}.targets[{j}]",
                       f"one of the matrix's targets ({', '.join(m.targets)})", _show(target))
        yield from _duplicates(f"{key}.targets", targets or (), "unique targets")
    made: dict[str, str] = {}  # "<stack>-<mode>" -> its names; names may contain "-"
    for stack in m.stacks:
        for mode in m.modes:
            names, cell = f"stack {_show(stack)} + mode {_show(mode)}", f"{stack}-{mode}"
            if cell in made:
                yield f"modes.{mode}", "names that make unique cell ids", (
                    f"cell id {_show(cell + '-<target>')} twice: {made[cell]}, {names}")
            made.setdefault(cell, names)


def _op_has_no_index(op: str) -> bool:
    from gate_residual_matrix import ops
    return op in ops.OPS and ops.get(op).index is None


def _duplicates(key: str, values: Collection[str],
                expected: str) -> Iterator[tuple[str, str, str]]:
    seen: set[str] = set()
    for i, value in enumerate(values):
        if value in seen:
            yield f"{key}[{i}]", expected, f"a second {_show(value)}"
        seen.add(value)


def parse_matrix(data: Any, source: str = "matrix.yaml", *,
                 known_implementations: Known = None) -> Matrix:
    """Validate parsed YAML ``data`` (a dict) into a :class:`Matrix`.

    ``source`` starts every message; ``known_implementations`` are the names
    ``implementations`` may use, or a function of the file's op that gives them (default:
    the op's :attr:`ops.spec.OpSpec.implementation_names`). Raises ConfigError, one line, for the first problem
    found, ending ``(+K more)`` when there are K others.

    Example::

        >>> parse_matrix({"schema_version": 1, "op": "gate_residual"})
        Traceback (most recent call last):
        runner.errors.ConfigError: matrix.yaml: problem: expected a value, got nothing (the key is missing) (+6 more)
    """  # noqa: E501
    known = known_implementations
    if callable(known):  # the registry's names of the file's op (runner.cell.catalog.known)
        op = data.get("op") if isinstance(data, Mapping) else None
        from gate_residual_matrix import ops
        known = known(op) if op in ops.OPS else None
    if known is not None:
        known = tuple(known) if isinstance(known, Sequence) else tuple(sorted(known))
    context = {"known_implementations": known}
    try:
        return Matrix.model_validate(data, context=context)
    except ValidationError as err:
        raise ConfigError(_one_line(f"{source}: {_describe(err, Matrix)}")) from err


def load_matrix(path: str | Path, *,
                known_implementations: Known = None) -> Matrix:
    """Read the matrix file at ``path`` and validate it (see :func:`parse_matrix`).

    Raises ConfigError naming the file when it cannot be read, is not UTF-8, is not
    YAML (a duplicate key or a tag of unordered or non-JSON values included) or fails
    validation.

    Example::

        >>> load_matrix("matrix.yaml").problem.sizes
        {'D': 5376, 'G': 9}
    """
    return read_matrix(path, known_implementations=known_implementations)[0]


def read_matrix(path: str | Path, *,
                known_implementations: Known = None) -> tuple[Matrix, bytes]:
    """:func:`load_matrix`, with the bytes it validated: a run hands its cells these bytes
    (a snapshot), never the file again, so an edit during the run cannot reach a report
    stamped with this matrix's fingerprint.

    Raises ConfigError as :func:`load_matrix`.
    """
    source = str(path)
    try:
        data_bytes = _read_matrix_file(Path(path), source)
        text = data_bytes.decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ConfigError(_one_line(f"{source}: cannot read the matrix file: {why}")) from err
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)  # a yaml.SafeLoader
    except RecursionError as err:  # below MAX_YAML_DEPTH: a small stack limit
        raise ConfigError(f"{source}: invalid YAML: nested too deeply") from err
    except ValueError as err:  # an integer of more digits than Python converts
        raise ConfigError(_one_line(f"{source}: invalid YAML: {err}")) from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or err
        raise ConfigError(_one_line(f"{source}: {where}invalid YAML: {problem}")) from err
    _refuse_huge_integers(data, source)
    return parse_matrix(data, source, known_implementations=known_implementations), data_bytes
