"""No value from matrix.yaml reaches a shell, a Dockerfile or a file name unvalidated.

Every string of a rich matrix (the shipped matrix.yaml plus an example of every optional
string field) is replaced in turn by shell metacharacters, newlines, NUL and path traversal,
keys included; each must be refused with a one-line ConfigError, unless the field is free
text by design (a mode's environment values), in which case the tests below show the value
travels as data: an argv list and an environment mapping, never through a shell, never into
the image. The string fields are found by walking the pydantic models, so a field added
later is covered, or this test fails until the rich matrix has an example of it.
"""

from __future__ import annotations

import copy
import subprocess
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pytest
import yaml
from pydantic import BaseModel

from gate_residual_matrix.runner.backends import host as host_backend
from gate_residual_matrix.runner.backends.docker import images
from gate_residual_matrix.runner.backends.docker.container import cell_command, container_config
from gate_residual_matrix.runner.cell import catalog as implementations
from gate_residual_matrix.runner.config import matrix as config
from gate_residual_matrix.runner.config.matrix import Matrix, load_matrix, parse_matrix
from gate_residual_matrix.runner.errors import ConfigError
from gate_residual_matrix.runner.plan.cells import expand
from gate_residual_matrix.runner.reports.store import CELL_ID_RE

ROOT = Path(__file__).resolve().parent.parent
MATRIX = ROOT / "matrix.yaml"

EVIL = [
    "x; rm -rf /", "$(touch /tmp/pwned)", "`id`", "${HOME}", "a|b", "a && b", "a > b",
    "x'y", 'x"y', "a b", "back\\slash", "line\nbreak", "carriage\rreturn", "nul\0byte",
    "../../etc/passwd", "..", "a/../b", "-rf", "*", "~root", "#comment", "", "\t",
]
#: Fields that are free text by design: where each goes is tested below.
FREE_TEXT = {("Mode", "env", "value")}
#: Host paths (wheelhouse, CA bundle): a user path, read on the host like --reports; may be
#: absolute or start with "-" (never an argument to a shell), never climb out with "..".
HOST_PATHS = {("PipOptions", "find_links", "value"), ("PipOptions", "ca_bundle", "value"),
              ("Libraries", "wheelhouse", "value"), ("Libraries", "rl_kernel", "value")}
HOST_PATH_OK = {"-rf"}


def rich() -> dict[str, Any]:
    """The shipped matrix plus an example of every optional string field."""
    data = yaml.safe_load(MATRIX.read_text())
    data["modes"]["det"] = {"env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
                            "torch": {"deterministic": True}}
    docker = next(s for s in data["stacks"].values() if s.get("kind") == "docker")
    docker.update(numba="0.61.0", numpy="2.4.4", diffusers="0.42.1", sglang="0.5.23",
                  vllm="0.30.0", triton="3.7.1", numba_cuda="0.30.4",
                  pip={"index_url": "https://pypi.org/simple",
                       "extra_index_urls": ["https://pypi.nvidia.com"],
                       "find_links": "wheels", "ca_bundle": "certs/ca.pem"})
    data.setdefault("libraries", {})["rl_kernel"] = "/opt/rl-kernel-h3"
    data["pairs"] = [["numba", "compiled"]]
    return data


@dataclass(frozen=True)
class Slot:
    """One string in the data: where it is, which model field holds it, key or value."""

    path: tuple[Any, ...]
    owner: tuple[str, str]
    kind: str  # "value" or "key"

    @property
    def rule(self) -> tuple[str, str, str]:
        return (*self.owner, self.kind)


def slots(model: BaseModel, raw: Mapping, path: tuple = ()) -> Iterator[Slot]:
    """Every string in ``raw`` (the data ``model`` was parsed from), with its model field."""
    for name in type(model).model_fields:
        if name in raw:
            owner = (type(model).__name__, name)
            yield from _slots(getattr(model, name), raw[name], (*path, name), owner)


def _slots(value: Any, raw: Any, path: tuple, owner: tuple[str, str]) -> Iterator[Slot]:
    if isinstance(value, BaseModel):
        yield from slots(value, raw, path)
    elif isinstance(value, str):
        yield Slot(path, owner, "value")
    elif isinstance(value, tuple):
        for i, item in enumerate(value):
            yield from _slots(item, raw[i], (*path, i), owner)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield Slot((*path, key), owner, "key")
            yield from _slots(item, raw[key], (*path, key), owner)


def _leaves(tp: Any) -> Iterator[Any]:
    """The leaf types of an annotation (through Annotated, unions, Literal, containers)."""
    origin = get_origin(tp)
    if origin is Annotated:
        yield from _leaves(get_args(tp)[0])
    elif origin in (Union, types.UnionType):
        for arg in get_args(tp):
            yield from _leaves(arg)
    elif origin is Literal:
        yield from (type(v) for v in get_args(tp))
    elif origin is not None:
        for arg in get_args(tp):
            if arg is not Ellipsis:
                yield from _leaves(arg)
    else:
        yield tp


def string_fields(model: type[BaseModel], seen: set | None = None) -> set[tuple[str, str]]:
    """(model, field) of every field that can hold a string, in ``model`` and below."""
    seen = set() if seen is None else seen
    found: set[tuple[str, str]] = set()
    if model in seen:
        return found
    seen.add(model)
    for name, field in model.model_fields.items():
        for leaf in _leaves(field.annotation):
            if isinstance(leaf, type) and issubclass(leaf, BaseModel):
                found |= string_fields(leaf, seen)
            elif isinstance(leaf, type) and issubclass(leaf, str):
                found.add((model.__name__, name))
    return found


def _set(data: dict, slot: Slot, evil: str) -> None:
    node = data
    for key in slot.path[:-1]:
        node = node[key]
    last = slot.path[-1]
    if slot.kind == "key":
        node[evil] = node.pop(last)
    else:
        node[last] = evil


def _parse(data: dict) -> Matrix:
    return parse_matrix(data, known_implementations=implementations.known)


RICH = rich()
RICH_SLOTS = list(slots(_parse(RICH), RICH))


def test_the_rich_matrix_has_an_example_of_every_string_field():
    covered = {s.owner for s in RICH_SLOTS}
    missing = sorted(string_fields(Matrix) - covered)
    assert not missing, f"add an example of {missing} to rich() in tests/test_security.py"
    assert len(RICH_SLOTS) > 60


@pytest.mark.parametrize("slot", RICH_SLOTS, ids=lambda s: ".".join(map(str, s.path)) + (
    "[key]" if s.kind == "key" else ""))
def test_metacharacters_newlines_and_traversal_in_every_string(slot):
    accepted = []
    for evil in EVIL:
        data = copy.deepcopy(RICH)
        _set(data, slot, evil)
        try:
            _parse(data)
        except ConfigError as err:
            message = str(err)
            assert message.startswith("matrix.yaml: ") and "\n" not in message, message
            assert "\r" not in message and "\0" not in message, repr(message)
            continue
        accepted.append(evil)
    if slot.rule in FREE_TEXT:
        assert not {"line\nbreak", "carriage\rreturn", "nul\0byte"} & set(accepted)
    elif slot.rule in HOST_PATHS:
        assert set(accepted) <= HOST_PATH_OK, f"{slot.path}: accepted {accepted}"
    else:
        assert accepted == [], f"{slot.path} ({slot.rule}) accepted {accepted}"


def test_yaml_is_loaded_safely(tmp_path):
    assert issubclass(config.UniqueKeyLoader, yaml.SafeLoader)
    marker = tmp_path / "pwned"
    path = tmp_path / "matrix.yaml"
    path.write_text(f'x: !!python/object/apply:os.system ["touch {marker}"]\n')
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_matrix(path)
    assert not marker.exists()


def test_every_cell_id_of_the_rich_matrix_is_a_safe_file_name(tmp_path):
    for cell in expand(_parse(rich())):
        assert CELL_ID_RE.match(cell.id) and "/" not in cell.id and ".." not in cell.id
        assert (tmp_path / f"{cell.id}.json").resolve().parent == tmp_path.resolve()


# ------------------------------------------------------------------ free text travels as data

EVIL_ENV = "probe-7f3a; rm -rf / $(id) `id` '\"|&><*~#"


def evil_env_matrix() -> Matrix:
    data = rich()
    data["modes"]["det"]["env"]["GATE_RESIDUAL_PROBE"] = EVIL_ENV
    data.pop("pip", None)  # no host paths to find when rendering an image
    return _parse(data)


def test_host_backend_passes_env_values_and_names_without_a_shell(tmp_path, monkeypatch):
    from gate_residual_matrix.runner.plan.cells import Cell

    seen = {}

    class Recorder:
        def __init__(self, argv, **kw):
            seen.update(argv=argv, **kw)
            self.pid, self.returncode = -1, 1  # never a real process group
            self.stdout = iter(())

        def communicate(self, timeout=None):
            return "", None

        def wait(self, timeout=None):
            return self.returncode

    monkeypatch.setenv("GATE_RESIDUAL_COMMIT", "0" * 40)  # no git call while Popen is faked
    monkeypatch.setattr(subprocess, "Popen", Recorder)
    m = evil_env_matrix()
    cell = Cell("host", "det", "cpu")
    report = host_backend.HostBackend().run(m, cell, m.cases, matrix_path=MATRIX,
                                            reports_dir=tmp_path, run_id="r1", timeout_s=5)
    assert isinstance(seen["argv"], list) and not seen.get("shell")
    assert seen["env"]["GATE_RESIDUAL_PROBE"] == EVIL_ENV
    assert seen["argv"][seen["argv"].index("--mode") + 1] == "det"
    assert report["status"] == "error"  # the recorder ran nothing


def test_docker_backend_passes_env_as_a_mapping_and_argv_as_a_list(tmp_path):
    from gate_residual_matrix.runner.plan.cells import Cell

    m = evil_env_matrix()
    docker = next(n for n, s in m.stacks.items() if s.kind == "docker")
    cell = Cell(docker, "det", "cpu")
    cfg = container_config("img:1", cell_command(cell, ["257"], "r1"), cell=cell, run_id="r1",
                           mode_env=m.modes["det"].env, matrix_path=MATRIX, stage_dir=tmp_path,
                           project={"commit": None, "dirty": None})
    assert cfg.create["environment"]["GATE_RESIDUAL_PROBE"] == EVIL_ENV
    assert cfg.create["command"][:4] == ["python", "-m", "gate_residual_matrix.runner",
                                         "cell"]  # no sh -c
    assert "entrypoint" not in cfg.create


def test_mode_env_never_reaches_an_image(tmp_path):
    m = evil_env_matrix()
    for name, stack in m.stacks.items():
        if stack.kind != "docker" or stack.pip.find_links or stack.pip.ca_bundle:
            continue
        spec = images.render(m, name, matrix_dir=tmp_path)
        texts = [spec.dockerfile, *(v.decode() for v in spec.files.values()
                                    if isinstance(v, bytes))]
        assert not any("GATE_RESIDUAL_PROBE" in t or "probe-7f3a" in t for t in texts), name
        break
    else:
        pytest.fail("matrix.yaml has no docker stack without host paths to render")
