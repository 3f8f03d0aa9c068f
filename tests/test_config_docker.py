"""Tests for ``kind: docker`` stacks and the ``pip:`` section of runner.config.matrix
(runner.config.pins)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate_residual_matrix.runner.config.matrix import (
    DockerStack,
    PipOptions,
    load_matrix,
    parse_matrix,
)
from gate_residual_matrix.runner.errors import ConfigError

MATRIX = Path(__file__).parent.parent / "matrix.yaml"
STACK = {"kind": "docker", "base_image": "gate-residual/base:bookworm-py3.11", "python": "3.11",
         "torch": "2.13.0"}


def with_stack(**fields: Any) -> dict[str, Any]:
    """The shipped matrix with one docker stack ``s``: STACK updated by ``fields``."""
    data = yaml.safe_load(MATRIX.read_text())
    data["stacks"] = {"host": {"kind": "host"}, "s": {**STACK, **fields}}
    return data


def test_shipped_docker_stacks_pin_real_versions() -> None:
    m = load_matrix(MATRIX)
    docker = {n: s for n, s in m.stacks.items() if isinstance(s, DockerStack)}
    torches = {s.torch for s in docker.values()}
    assert len({t.split("+")[0] for t in torches}) >= 3, torches  # three torch releases
    for name, stack in docker.items():
        assert stack.python == "3.11" and stack.numba_cuda == "==0.30.4", name
        if "+cpu" not in stack.torch:
            assert stack.triton, f"{name}: a CUDA torch stack pins the triton torch pins"
    assert any(s.vllm for s in docker.values()) and any(s.sglang for s in docker.values())
    assert m.pip.ca_bundle == "/etc/ssl/certs/ca-certificates.crt"


def test_versions_are_normalised() -> None:
    s = parse_matrix(with_stack(torch="2.14.1", triton="~=3.8.0", vllm=">=0.30, <0.31",
                                numpy="<2.5", numba_cuda="0.30.4")).stacks["s"]
    assert s.pins() == {"python": "3.11", "torch": "==2.14.1", "triton": "~=3.8.0",
                        "vllm": "<0.31,>=0.30", "numba-cuda": "==0.30.4", "numpy": "<2.5"}
    assert parse_matrix(with_stack(torch="2.13.0+cpu")).stacks["s"].torch == "==2.13.0+cpu"


def test_unpinned_packages_are_left_out_and_round_trip() -> None:
    m = parse_matrix(with_stack(sglang="0.5.23"))
    dumped = m.to_dict()["stacks"]["s"]
    assert dumped == {**STACK, "torch": "==2.13.0", "sglang": "==0.5.23", "pip": {}}
    assert parse_matrix(m.to_dict()) == m


def test_stack_pip_replaces_global_pip_key_by_key() -> None:
    data = with_stack(pip={"find_links": "/opt/wheels", "extra_index_urls": []})
    data["pip"] = {"index_url": "https://pypi.org/simple", "ca_bundle": "ca.pem",
                   "extra_index_urls": ["https://example.org/simple"]}
    m = parse_matrix(data)
    merged = m.stacks["s"].pip.over(m.pip)
    assert merged == PipOptions(index_url="https://pypi.org/simple", extra_index_urls=(),
                                find_links="/opt/wheels", ca_bundle="ca.pem")


def test_pins_change_the_content_hash() -> None:
    a = parse_matrix(with_stack()).content_hash()
    assert parse_matrix(with_stack(triton="3.7.1")).content_hash() != a
    assert parse_matrix(with_stack(torch="==2.13.0")).content_hash() == a  # same pin, spelled


# (test id, stack fields, key path under stacks.s, a fragment of the message)
BAD: list[tuple[str, dict[str, Any], str, str]] = [
    ("shell in a version", {"torch": "2.13.0; rm -rf /"}, "torch",
     'a version like "2.13.0" or a specifier like ">=2.13,<2.14", got "2.13.0; rm -rf /"'),
    ("a word", {"torch": "latest"}, "torch", 'got "latest"'),
    ("arbitrary equality", {"vllm": "===0.30.0"}, "vllm", 'no "==="'),
    ("empty version", {"sglang": ""}, "sglang", 'got ""'),
    ("newline in a version", {"triton": "3.7.1\nRUN curl x | sh"}, "triton", "got"),
    ("or-ed shell", {"diffusers": "==0.42.1 || true"}, "diffusers", "a specifier"),
    ("a YAML float", {"torch": 2.13}, "torch", "a string, got 2.13"),
    ("python a float", {"python": 3.11}, "python", "a string, got 3.11"),
    ("python major only", {"python": "3"}, "python", '"3.<minor>"'),
    ("python with patch", {"python": "3.11.2"}, "python", '"3.<minor>"'),
    ("no tag", {"base_image": "ubuntu"}, "base_image", "tag required"),
    ("upper-case name", {"base_image": "Ubuntu:24.04"}, "base_image", 'got "Ubuntu:24.04"'),
    ("short digest", {"base_image": "x:1@sha256:abc"}, "base_image", "64 hex digits"),
    ("shell in an image", {"base_image": "x:1;reboot"}, "base_image", 'got "x:1;reboot"'),
    ("numpy 2.5", {"numpy": "2.5.0"}, "numpy", "numpy below 2.5"),
    ("torch missing", {"torch": None}, "torch", "a string, got null"),
    ("unknown package", {"jax": "0.4"}, "jax", 'got unknown key "jax"'),
    ("credentials in a URL", {"pip": {"index_url": "https://u:p@example.org/simple"}},
     "pip.index_url", "without credentials"),
    ("ftp URL", {"pip": {"index_url": "ftp://example.org/simple"}}, "pip.index_url",
     "http(s)://"),
    ("quote in a URL", {"pip": {"extra_index_urls": ["https://a.org/'x"]}},
     "pip.extra_index_urls[0]", "no whitespace, quotes"),
    ("path traversal", {"pip": {"find_links": "wheels/../../etc"}}, "pip.find_links",
     'without ".."'),
    ("variable in a path", {"pip": {"find_links": "$HOME/wheels"}}, "pip.find_links",
     "shell metacharacters"),
    ("space in a path", {"pip": {"ca_bundle": "my ca.pem"}}, "pip.ca_bundle", "no whitespace"),
    ("unknown pip key", {"pip": {"trusted_host": "x"}}, "pip.trusted_host",
     "one of the keys index_url, extra_index_urls, find_links, ca_bundle"),
]


@pytest.mark.parametrize(("fields", "path", "fragment"), [b[1:] for b in BAD],
                         ids=[b[0] for b in BAD])
def test_bad_docker_stack(fields: dict[str, Any], path: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_matrix(with_stack(**fields))
    message = str(info.value)
    assert len(message.splitlines()) == 1, message
    assert message.startswith(f"matrix.yaml: stacks.s.{path}: expected "), message
    assert fragment in message, message


@pytest.mark.parametrize(("change", "fragment"), [
    (lambda d: d.update(pip={"index_url": "https://x.org/s;id"}), "pip.index_url: expected"),
    (lambda d: d.update(pip=["x"]), "pip: expected a mapping"),
])
def test_bad_global_pip(change: Callable[[dict[str, Any]], None], fragment: str) -> None:
    data = with_stack()
    change(data)
    with pytest.raises(ConfigError, match=f"^matrix.yaml: {fragment}"):
        parse_matrix(data)
