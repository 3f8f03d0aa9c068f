"""The matrix's building blocks (runner.config.matrix assembles them into
:class:`~runner.config.matrix.
Matrix`): frozen models and annotated value types, and the sections that are not the
problem or its cases: ``libraries``, ``modes`` (torch settings, environment) and ``stacks``
(host or docker, with pip options)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal, TypeVar, Union, get_args

from packaging.version import Version
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    StringConstraints,
    WrapSerializer,
    field_validator,
    model_serializer,
)
from pydantic_core import PydanticCustomError

from gate_residual_matrix.runner.config import pins
from gate_residual_matrix.runner.config.errors import (
    ENV_NAME_PATTERN,
    NAME_PATTERN,
    _one_of,
    _path,
    _show,
)

LIBRARY_DISTRIBUTIONS: tuple[str, ...] = ("sglang", "vllm-omni", "liger-kernel", "vllm")
"""The keys ``libraries.versions`` may use: the distributions of the library implementations
that run per version (contract/versioned.py; RL-Kernel runs from a source tree,
``libraries.rl_kernel``, not per version). tests/test_config.py checks them against the
registry."""
MAX_ENV_VALUE_BYTES = 32 * 1024
"""One mode environment value at most (Linux refuses a ``NAME=value`` over 128 KiB)."""
MAX_ENV_BYTES = 128 * 1024
"""A mode's ``NAME=value`` entries together at most (beside the host's own environment)."""

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


_K = TypeVar("_K")
_V = TypeVar("_V")
_T = TypeVar("_T")

MapOf = Annotated[Mapping[_K, _V], AfterValidator(FrozenMap),
                  WrapSerializer(lambda v, dump: dump(dict(v)))]
"""``MapOf[key, value]``: a ``Mapping`` validated as a dict, kept as a :class:`FrozenMap`,
dumped as a dict (generic type aliases: the type checker sees ``Mapping[key, value]``)."""
NonEmptyMapOf = Annotated[Mapping[_K, _V], Field(min_length=1), AfterValidator(FrozenMap),
                          WrapSerializer(lambda v, dump: dump(dict(v)))]
""":data:`MapOf` with at least one entry."""
ListOf = Annotated[tuple[_T, ...], Field(strict=False, min_length=1)]
"""``ListOf[item]``: a non-empty YAML list kept as a tuple (lax only about list -> tuple;
items stay strict)."""


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
    """Library versions as a matrix dimension (contract/versioned.py).

    ``versions``: distribution -> versions; each library implementation of that distribution
    becomes one row per version, ``<implementation>-<version>``, loaded kernel-only from
    ``wheelhouse`` (built by ``nox -s kernel_wheelhouse``; relative to the project root;
    ``$GATE_RESIDUAL_WHEELHOUSE`` overrides it) where that version is not installed.
    ``rl_kernel``: the RL-Kernel source tree (``$GATE_RESIDUAL_RL_KERNEL`` overrides it;
    default: .carry/rl-kernel-h3, else ../shared/third_party/rl-kernel-h3).
    """

    wheelhouse: HostPath = ".carry/kernel-wheelhouse"
    versions: MapOf[Distribution, ListOf[Annotated[StrictStr, AfterValidator(_pep440)]]] = (
        FrozenMap())
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

    env: Annotated[MapOf[EnvName, EnvValue], AfterValidator(_env_total)] = FrozenMap()
    torch: TorchSettings = TorchSettings()
    targets: ListOf[Target] | None = None

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


