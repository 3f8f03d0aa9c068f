"""Reading the matrix file: a bounded regular file, YAML without duplicate keys, bounded
depth, bounded alias expansion and bounded integers (runner.config.matrix validates the result)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gate_residual_matrix.runner.config.errors import _show
from gate_residual_matrix.runner.errors import ConfigError
from gate_residual_matrix.runner.untrusted import files

MAX_MATRIX_BYTES = 1 << 20
"""The matrix file's size at most (matrix.yaml is about 8 KB)."""
MAX_YAML_DEPTH = 32
"""Nesting of the matrix file at most (matrix.yaml nests 4 deep)."""
MAX_YAML_NODES = 100_000
"""Values in the matrix file at most, each alias counted as often as it is used."""
MAX_INTEGER_BITS = 128
"""No value of a matrix needs more: larger integers (YAML's hex and octal forms are not
bounded by Python's 4300-digit rule) are refused before anything formats them."""


def _refuse_huge_integers(node: Any, source: str, path: str = "") -> None:
    """Raise :class:`ConfigError` naming the first integer wider than
    :data:`MAX_INTEGER_BITS` bits (the file's depth is already bounded)."""
    if isinstance(node, bool):
        return
    if isinstance(node, int) and node.bit_length() > MAX_INTEGER_BITS:
        raise ConfigError(f"{source}: {path or 'top level'}: expected a number of at most "
                          f"{MAX_INTEGER_BITS} bits, got one of {node.bit_length()} bits")
    if isinstance(node, dict):
        for key, value in node.items():
            _refuse_huge_integers(value, source, f"{path}.{key}" if path else str(key)[:80])
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _refuse_huge_integers(value, source, f"{path}[{i}]")


def _read_matrix_file(path: Path, source: str) -> bytes:
    """The bytes of a regular file of at most :data:`MAX_MATRIX_BYTES`; a FIFO or device is
    refused without blocking on it.

    Raises:
        ConfigError: not a regular file, or too large.
        OSError: cannot be read.
    """
    try:
        data = files.read_bounded(path, MAX_MATRIX_BYTES)
    except files.NotRegular as err:
        raise ConfigError(f"{source}: cannot read the matrix file: not a regular file "
                          f"({err.kind})") from err
    except files.TooLarge as err:
        got = "more" if err.size is None else err.size
        raise ConfigError(f"{source}: expected a matrix file of at most {MAX_MATRIX_BYTES} "
                          f"bytes, got {got} bytes") from err
    return data


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a duplicate key rather than keep the last value, YAML
    nested deeper than :data:`MAX_YAML_DEPTH` (before Python's recursion limit is reached)
    and a document of more than :data:`MAX_YAML_NODES` values once aliases are expanded
    (a few lines of ``&a [*b, *b, ...]`` make billions)."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {MAX_YAML_DEPTH} levels deep",
                    self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: yaml.Node) -> Any:
        sizes: dict[int, int] = {}

        def expanded(n: yaml.Node) -> int:  # depth is bounded by compose_node
            if id(n) not in sizes:
                sizes[id(n)] = MAX_YAML_NODES + 1  # a cycle (a recursive alias) is too big
                children = ([c for pair in n.value for c in pair]
                            if isinstance(n, yaml.MappingNode)
                            else n.value if isinstance(n, yaml.SequenceNode) else [])
                total = 1
                for child in children:
                    total += expanded(child)
                    if total > MAX_YAML_NODES:
                        break
                sizes[id(n)] = min(total, MAX_YAML_NODES + 1)
            return sizes[id(n)]

        if expanded(node) > MAX_YAML_NODES:
            raise yaml.constructor.ConstructorError(
                None, None, f"more than {MAX_YAML_NODES} values once aliases are expanded",
                node.start_mark)
        return super().construct_document(node)


def _unique_key_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[tuple[type, Any]] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may be overridden
            continue
        key = loader.construct_object(key_node)
        if isinstance(key, (str, int, float)):
            if (type(key), key) in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {_show(key)}", key_node.start_mark)
            seen.add((type(key), key))
    return loader.construct_mapping(node)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                                 _unique_key_mapping)

REFUSED_TAGS = {"set": "an unordered set (its order, so the fingerprint, would change from "
                       "run to run): write a list",
                "omap": "a list of pairs: write a mapping",
                "pairs": "a list of pairs: write a mapping",
                "binary": "bytes: write a string"}
"""YAML tags whose values are not ordered JSON-like data (mapping, list, string, number,
bool, null): refused, so that the matrix's canonical form (and its fingerprint) is one."""


def _refuse_tag(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    name = node.tag.rsplit(":", 1)[-1]
    raise yaml.constructor.ConstructorError(
        None, None, f"the tag !!{name} builds {REFUSED_TAGS[name]}", node.start_mark)


for _tag in REFUSED_TAGS:
    UniqueKeyLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _refuse_tag)
