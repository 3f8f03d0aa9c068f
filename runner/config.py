"""Load and validate matrix.yaml into frozen, typed objects (stage 1 of the pipeline).

Parse once, at the boundary: unknown keys, wrong types and bad values are errors, and
each becomes one :class:`~runner.errors.ConfigError` with a one-line message,
``<file>: <key path>: expected <what>, got <what was found>``, e.g.
``matrix.yaml: cases[2].n: expected an integer >= 1, got 0``. Reading the file is
:mod:`runner.config_yaml`'s (bounded size, depth, aliases, integers; no duplicate key);
turning pydantic's errors into that line is :mod:`runner.config_errors`'s.

Example::

    >>> m = load_matrix("matrix.yaml")
    >>> [c.id for c in m.cases][4:6], m.baseline, list(m.modes)[:2]
    (['257-specials', '1-bfloat16-int32'], 'eager', ['plain', 'deterministic'])
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args

import yaml
from packaging.version import Version
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    WrapSerializer,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from runner import pins
from runner.config_errors import (
    ENV_NAME_PATTERN,
    NAME_PATTERN,
    _describe,
    _one_line,
    _one_of,
    _path,
    _show,
)
from runner.config_yaml import _read_matrix_file, _refuse_huge_integers, _UniqueKeyLoader
from runner.errors import ConfigError

__all__ = ["DTYPES", "INDEX_DTYPES", "LIBRARY_DISTRIBUTIONS", "PROBLEM_KEYS",
           "SCHEMA_VERSION", "TARGETS",
           "BatchInvariance", "Case", "DockerStack", "FrozenMap", "HostStack", "Libraries",
           "Matrix", "Mode",
           "PipOptions", "Problem", "Stack", "Timing", "TorchSettings", "load_matrix",
           "parse_matrix"]

SCHEMA_VERSION = 1
LIBRARY_DISTRIBUTIONS: tuple[str, ...] = ("sglang", "vllm-omni")
"""The keys ``libraries.versions`` may use: the distributions of the library implementations
that run per version (runner/implementations/versioned.py; RL-Kernel runs from a source tree,
``libraries.rl_kernel``, not per version). tests/test_config.py checks them against the
registry."""
MAX_REPEATS = 1000
"""``repeats`` at most: each repeat runs every implementation on every case once more."""
MAX_TIMING_CALLS = 100_000
"""``timing.warmup`` and ``timing.iters`` at most (per case and implementation)."""
MAX_SWEEP_SIZE = 1 << 20
"""``batch_invariance.max_size`` at most (the sweep runs once per size up to it)."""
MAX_ENV_VALUE_BYTES = 32 * 1024
"""One mode environment value at most (Linux refuses a ``NAME=value`` over 128 KiB)."""
MAX_ENV_BYTES = 128 * 1024
"""A mode's ``NAME=value`` entries together at most (beside the host's own environment)."""
Known = Collection[str] | Callable[[str], Collection[str]] | None
"""``known_implementations``: names, a function of the op giving them, or None (the op's)."""


class FrozenMap(Mapping):
    """A read-only, hashable mapping that keeps insertion (file) order."""

    __slots__ = ("_data",)

    def __init__(self, items: Mapping[Any, Any] | None = None) -> None:
        self._data = dict(items or {})

    def __getitem__(self, key: Any) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"


def _map_of(key: Any, value: Any, min_length: int = 0) -> Any:
    """``Mapping[key, value]``: validated as a dict, kept as a FrozenMap, dumped as a dict."""
    return Annotated[Mapping[key, value], Field(min_length=min_length),
                     AfterValidator(FrozenMap), WrapSerializer(lambda v, dump: dump(dict(v)))]


def _list_of(item: Any) -> Any:
    """A non-empty YAML list kept as a tuple (lax only about list -> tuple; items stay strict)."""
    return Annotated[tuple[item, ...], Field(strict=False, min_length=1)]


def _env_value(value: str) -> str:
    if any(c in value for c in "\n\r\0"):
        raise PydanticCustomError("matrix", "bad value", {"expected": "no newline or NUL"})
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise PydanticCustomError("matrix", "bad value", {
            "expected": "text that UTF-8 can encode (no lone surrogate)"}) from None
    if len(value.encode("utf-8", "surrogatepass")) > MAX_ENV_VALUE_BYTES:
        raise PydanticCustomError("matrix", "bad value", {
            "expected": f"a value of at most {MAX_ENV_VALUE_BYTES} bytes",
            "got": f"{len(value.encode('utf-8', 'surrogatepass'))} bytes"})
    return value


def _env_total(env: Mapping[str, str]) -> Mapping[str, str]:
    """A mode's whole environment must fit beside the host's (the kernel's argument and
    environment space: one ``NAME=value`` at most 128 KiB, all together a few MiB)."""
    total = sum(len(f"{k}={v}".encode("utf-8", "surrogatepass")) + 1 for k, v in env.items())
    if total > MAX_ENV_BYTES:
        raise PydanticCustomError("matrix", "bad value", {
            "expected": f"NAME=value entries of at most {MAX_ENV_BYTES} bytes together",
            "got": f"{total} bytes"})
    return env


Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME_PATTERN)]
EnvValue = Annotated[StrictStr, AfterValidator(_env_value)]
VersionSpec = Annotated[StrictStr, AfterValidator(pins.version_spec)]  # "2.13.0" -> "==2.13.0"
PythonVersion = Annotated[StrictStr, AfterValidator(pins.python_version)]
ImageRef = Annotated[StrictStr, AfterValidator(pins.image_ref)]
PipUrl = Annotated[StrictStr, AfterValidator(pins.pip_url)]
HostPath = Annotated[StrictStr, AfterValidator(pins.safe_path)]
# a PyPI project name (pydantic's regex engine: "$" is the end of the text, no newline before)
Distribution = Annotated[str, StringConstraints(
    pattern=r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?$")]
DType = Literal["bfloat16", "float16", "float32"]
IndexDType = Literal["int64", "int32"]
Target = Literal["cuda", "cpu"]
DTYPES: tuple[str, ...] = get_args(DType)
INDEX_DTYPES: tuple[str, ...] = get_args(IndexDType)
TARGETS: tuple[str, ...] = get_args(Target)


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


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
    """One size: ``n`` rows; ``specials`` plants NaN, +-Inf, +-0.0, subnormals, extremes.

    ``dtype`` and ``index_dtype`` override the problem's for this case; in a validated
    :class:`Matrix` both are set (the case's own pair) or both None (the problem's pair),
    whichever way the file wrote them. ``targets``: the targets whose cells run this case
    (None: every target of the matrix), for cases too slow for a CPU cell.
    """

    n: Annotated[StrictInt, Field(ge=1)]
    specials: StrictBool = False
    dtype: DType | None = None
    index_dtype: IndexDType | None = None
    targets: _list_of(Target) | None = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, dump: Any) -> dict[str, Any]:
        return {k: v for k, v in dump(self).items() if v is not None}

    @property
    def base_id(self) -> str:
        """``"257"`` or ``"257-specials"``: the id without the dtypes; it keys the input
        streams, so a case has the same values (rounded to its dtype) in every dtype."""
        return f"{self.n}-specials" if self.specials else str(self.n)

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
    """Timing loop: ``warmup`` untimed calls, then ``iters`` timed ones."""

    warmup: Annotated[StrictInt, Field(ge=0, le=MAX_TIMING_CALLS)] = 5
    iters: Annotated[StrictInt, Field(ge=1, le=MAX_TIMING_CALLS)] = 50


class BatchInvariance(_Frozen):
    """Batch-invariance checks (:mod:`runner.batch_invariance`), run when the key is given:
    ``max_size`` caps the size sweep and the padded batch (CPU run time)."""

    max_size: Annotated[StrictInt, Field(ge=1, le=MAX_SWEEP_SIZE)] = 1025


def _pep440(v: str) -> str:
    try:
        Version(v)
    except Exception:
        raise PydanticCustomError("matrix", "not a version", {
            "expected": "a PEP 440 version such as 0.5.23"}) from None
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", v):  # it ends a report's row name
        raise PydanticCustomError("matrix", "not a row name", {
            "expected": "a version of letters, digits, _ . - (it ends a row name)"})
    return v


class Libraries(_Frozen):
    """Library versions as a matrix dimension (issue 13; runner/implementations/versioned.py).

    ``versions``: distribution -> versions; each library implementation of that distribution
    becomes one row per version, ``<implementation>-<version>``, loaded kernel-only from
    ``wheelhouse`` (built by ``nox -s kernel_wheelhouse``; relative to the project root;
    ``$GATE_RESIDUAL_WHEELHOUSE`` overrides it) where that version is not installed.
    ``rl_kernel``: the RL-Kernel source tree (``$GATE_RESIDUAL_RL_KERNEL`` overrides it;
    default: .carry/rl-kernel-h3, else ../shared/third_party/rl-kernel-h3).
    """

    wheelhouse: HostPath = ".carry/kernel-wheelhouse"
    versions: _map_of(Distribution,
                      _list_of(Annotated[StrictStr, AfterValidator(_pep440)])) = FrozenMap()
    rl_kernel: HostPath | None = None

    @field_validator("versions")
    @classmethod
    def _known_distributions(cls, v: Mapping[str, Any]) -> Mapping[str, Any]:
        unknown = [key for key in v if key not in LIBRARY_DISTRIBUTIONS]
        if unknown:
            close = difflib.get_close_matches(unknown[0], LIBRARY_DISTRIBUTIONS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            others = f"; unknown too: {', '.join(map(_show, unknown[1:]))}" if unknown[1:] else ""
            raise PydanticCustomError("matrix", "unknown distribution", {
                "path": _path(["libraries", "versions", unknown[0]]),
                "expected": "a distribution with versioned library implementations ("
                            f"{_one_of(list(LIBRARY_DISTRIBUTIONS))})",
                "got": f"unknown key {_show(unknown[0])}{hint}{others}"})
        for key, listed in v.items():  # a version twice would make its row twice
            repeated = sorted({x for x in listed if list(listed).count(x) > 1})
            if repeated:
                raise PydanticCustomError("matrix", "repeated version", {
                    "path": _path(["libraries", "versions", key]),
                    "expected": "each version once",
                    "got": f"{_show(repeated[0])} more than once"})
        return v


class TorchSettings(_Frozen):
    """Torch switches a mode sets; ``None`` (unset) leaves torch's default alone."""

    deterministic: StrictBool | None = None  # torch.use_deterministic_algorithms
    tf32: StrictBool | None = None  # TF32 in matmul and cuDNN
    inference_mode: StrictBool | None = None  # run under torch.inference_mode()

    @model_serializer(mode="wrap")
    def _drop_unset(self, dump: Any) -> dict[str, Any]:
        return {k: v for k, v in dump(self).items() if v is not None}


class Mode(_Frozen):
    """A run mode: ``env`` for the cell process (name -> value) and ``torch`` settings;
    ``targets``: the targets it has cells on (None: every target of the matrix)."""

    env: Annotated[_map_of(EnvName, EnvValue), AfterValidator(_env_total)] = FrozenMap()
    torch: TorchSettings = TorchSettings()
    targets: _list_of(Target) | None = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, dump: Any) -> dict[str, Any]:
        data = dump(self)
        if data.get("targets") is None:
            data.pop("targets", None)
        return data

    def runs_on(self, target: str) -> bool:
        """Whether this mode has a cell on ``target``."""
        return self.targets is None or target in self.targets


class HostStack(_Frozen):
    """``kind: host``: the interpreter that runs the matrix, as it is."""

    kind: Literal["host"]


class PipOptions(_Frozen):
    """pip options for image builds (``pip:`` at the top level, or in a docker stack).

    ``index_url`` replaces PyPI, ``extra_index_urls`` are searched too, ``find_links`` is
    a local wheelhouse directory (copied into the build context), ``ca_bundle`` a PEM
    file the build trusts (TLS-intercepting proxies). Paths are absolute or relative to
    matrix.yaml's directory. A stack's own ``pip:`` replaces the global one key by key.
    """

    index_url: PipUrl | None = None
    extra_index_urls: Annotated[tuple[PipUrl, ...], Field(strict=False)] | None = None
    find_links: HostPath | None = None
    ca_bundle: HostPath | None = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, dump: Any) -> dict[str, Any]:
        return {k: v for k, v in dump(self).items() if v is not None}

    def over(self, base: PipOptions) -> PipOptions:
        """These options on top of ``base``: each key set here replaces base's."""
        return base.model_copy(update={k: getattr(self, k) for k in self.model_fields_set})


class DockerStack(_Frozen):
    """``kind: docker``: an image built from ``containers/Dockerfile.in`` with these pins.

    ``base_image`` is ``name:tag`` (optionally ``@sha256:<digest>``), never pulled by the
    runner; ``python`` is ``3.<minor>``, the interpreter the base image has or installs.
    Package pins are PEP 440 versions or specifier sets (``"2.13.0"`` means ``==2.13.0``);
    ``None`` leaves the package out (torch is required). numba-cuda 0.30 needs numpy<2.5,
    which every image adds.
    """

    kind: Literal["docker"]
    base_image: ImageRef
    python: PythonVersion
    torch: VersionSpec
    triton: VersionSpec | None = None
    vllm: VersionSpec | None = None
    sglang: VersionSpec | None = None
    diffusers: VersionSpec | None = None
    numba: VersionSpec | None = None
    numba_cuda: VersionSpec | None = None
    numpy: VersionSpec | None = None
    pip: PipOptions = PipOptions()

    @model_serializer(mode="wrap")
    def _drop_unpinned(self, dump: Any) -> dict[str, Any]:
        return {k: v for k, v in dump(self).items() if v is not None}

    @field_validator("numpy")
    @classmethod
    def _numpy_below_2_5(cls, v: str | None) -> str | None:
        if v and v.startswith("==") and "*" not in v and Version(v[2:]) >= Version("2.5"):
            raise PydanticCustomError("matrix", "bad value", {
                "expected": "numpy below 2.5 (numba-cuda 0.30 fails with numpy 2.5)"})
        return v

    def pins(self) -> dict[str, str]:
        """``{distribution: specifier}`` for every pinned package, ``python`` first.

        Example::

            >>> DockerStack(kind="docker", base_image="b:1", python="3.11",
            ...             torch="2.13.0").pins()
            {'python': '3.11', 'torch': '==2.13.0'}
        """
        names = ("torch", "triton", "vllm", "sglang", "diffusers", "numba", "numba_cuda", "numpy")
        found = {n.replace("_", "-"): getattr(self, n) for n in names if getattr(self, n)}
        return {"python": self.python, **found}


# One model per backend, told apart by `kind`.
Stack = Annotated[Union[HostStack, DockerStack], Field(discriminator="kind")]  # noqa: UP007


class Matrix(_Frozen):
    """The validated matrix; a cell (stack, mode, target) runs every case x implementation.

    Fields: ``schema_version`` (1), ``op``, ``problem``, ``cases``, ``implementations``,
    ``baseline`` (compared bitwise with all), ``accuracy_reference`` (or None), ``repeats``,
    ``timing``, ``modes`` and ``stacks`` (name -> Mode / Stack, file order), ``targets``,
    ``pip`` (image build options every docker stack starts from).
    Lists are tuples, mappings are read-only :class:`FrozenMap`. Build one with
    :func:`load_matrix` or :func:`parse_matrix`, which raise ConfigError.

    Example::

        >>> m = load_matrix("matrix.yaml"); m.to_dict()["targets"], len(m.content_hash())
        (['cuda', 'cpu'], 64)
    """

    schema_version: StrictInt
    op: StrictStr
    problem: Problem
    cases: _list_of(Case)
    implementations: _list_of(StrictStr)
    baseline: StrictStr
    accuracy_reference: StrictStr | None = None
    repeats: Annotated[StrictInt, Field(ge=1, le=MAX_REPEATS)] = 3
    timing: Timing = Timing()
    batch_invariance: BatchInvariance | None = None
    modes: _map_of(Name, Mode, min_length=1)
    stacks: _map_of(Name, Stack, min_length=1)
    targets: _list_of(Target)
    pip: PipOptions = PipOptions()  # defaults for every docker stack's image build
    libraries: Libraries | None = None  # library versions as rows (issue 13)

    @field_validator("op")
    @classmethod
    def _known_op(cls, op: str) -> str:
        """``op`` is one of :data:`ops.OPS`."""
        import ops

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
        import ops

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
            import ops

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
    yield from _duplicates("targets", m.targets, "unique targets")
    named = [(f"cases[{i}]", c.targets) for i, c in enumerate(m.cases)]
    named += [(f"modes.{name}", mode.targets) for name, mode in m.modes.items()]
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


def _duplicates(key: str, values: Collection[str], expected: str) -> Iterator[tuple[str, ...]]:
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
    if callable(known):  # the registry's names of the file's op (runner.implementations.known)
        op = data.get("op") if isinstance(data, Mapping) else None
        import ops

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
    YAML (a duplicate key included) or fails validation.

    Example::

        >>> load_matrix("matrix.yaml").problem.sizes
        {'D': 5376, 'G': 9}
    """
    source = str(path)
    try:
        text = _read_matrix_file(Path(path), source)
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ConfigError(_one_line(f"{source}: cannot read the matrix file: {why}")) from err
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a yaml.SafeLoader
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
    return parse_matrix(data, source, known_implementations=known_implementations)
