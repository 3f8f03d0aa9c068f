"""A pydantic ValidationError of the matrix as one line (runner.config.matrix's messages):
``<key path>: expected <what>, got <what was found>``, and the words of the name patterns."""

from __future__ import annotations

import difflib
import json
import re
import types
from collections.abc import Mapping
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"  # mode and stack names: they become file names
ENV_NAME_PATTERN = r"^[A-Z_][A-Z0-9_]*$"
_PATTERN_WORDS = {
    NAME_PATTERN: "a name of 1-63 characters from a-z 0-9 _ . - starting with a letter or digit",
    ENV_NAME_PATTERN: f"an environment variable name matching {ENV_NAME_PATTERN}",
}

_EXPECTED = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "bool_type": "true or false", "bool_parsing": "true or false", "string_type": "a string",
    "dict_type": "a mapping", "model_type": "a mapping", "mapping_type": "a mapping",
    "model_attributes_type": "a mapping",
    "list_type": "a list", "tuple_type": "a list", "missing": "a value",
    "greater_than_equal": "an integer >= {ge}", "less_than_equal": "an integer <= {le}",
}


def _describe(err: ValidationError, root: type[BaseModel]) -> str:
    """``<key path>: expected <x>, got <y>`` for the first error, plus ``(+K more)``."""
    errors = [e for e in err.errors() if not _follow_up(e)] or err.errors()
    # an unknown key first: a misspelled key also makes its right spelling "missing"
    errors.sort(key=lambda e: e["type"] != "extra_forbidden")
    kind, ctx, found = errors[0]["type"], errors[0].get("ctx") or {}, errors[0].get("input")
    parts, parent, node = _walk(errors[0]["loc"], root)
    expected, got, more = _EXPECTED.get(kind, "").format(**ctx), _show(found), len(errors) - 1
    if kind == "matrix":
        parts = [ctx["path"]] if "path" in ctx else parts
        expected, got, more = ctx["expected"], ctx.get("got", got), more + ctx.get("more", 0)
    elif kind == "extra_forbidden":
        keys = _fields(parent) or ["(none)"]
        expected = f"one of the keys {', '.join(keys)}" if len(keys) > 1 else f"the key {keys[0]}"
        close = difflib.get_close_matches(str(parts[-1]), keys, n=1)
        got = f"unknown key {_show(parts[-1])}" + (f" (did you mean {close[0]}?)" if close else "")
        others = [_path(_walk(e["loc"], root)[0]) for e in errors[1:]
                  if e["type"] == "extra_forbidden"]
        if others:  # every unknown key is named
            got += f"; unknown too: {', '.join(others)}"
    elif kind == "literal_error":
        expected = _one_of(re.findall(r"'([^']*)'", ctx["expected"]))
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        parts, expected, got = _tag_problem(parts, node, ctx, found)
    elif kind == "too_short":
        expected = "a non-empty " + ("mapping" if ctx["field_type"] == "Dictionary" else "list")
    elif kind == "string_pattern_mismatch":
        expected = _PATTERN_WORDS.get(ctx["pattern"], f"a string matching {ctx['pattern']}")
    elif kind == "invalid_key":  # a key that YAML made a number, bool or null
        parts, expected, got = parts[:-1], "string keys", f"the key {got}"
    elif kind == "model_type" and not parts and found is None:
        got = "an empty document"
    elif kind == "missing":
        got = "nothing (the key is missing)"
    elif not expected:
        expected = f"a valid value ({errors[0]['msg']})"
    path = parts[0] if kind == "matrix" and "path" in ctx else _path(parts)
    return f"{path}: expected {expected}, got {got}" + (f" (+{more} more)" if more else "")


def _tag_problem(parts: list[int | str], node: Any, ctx: Mapping[str, Any],
                 found: Any) -> tuple[list[int | str], str, str]:
    """(key path, expected, got) for a union's tag (a stack's ``kind``) that is wrong or
    missing: the bad value with the closest kind, or else the unknown key that is most
    likely the tag misspelled, with its value; the allowed kinds either way."""
    tag = ctx["discriminator"].strip("'")
    tags = [str(_tag(v)) for v in _variants(node)]
    if "tag" in ctx:
        value = found.get(tag, ctx["tag"]) if isinstance(found, Mapping) else ctx["tag"]
        close = difflib.get_close_matches(str(value), tags, n=1)
        hint = f" (did you mean {close[0]}?)" if close and isinstance(value, str) else ""
        return [*parts, tag], _one_of(tags), _show(value) + hint
    known = set(_fields(node))
    unknown = [k for k in found if k not in known] if isinstance(found, Mapping) else []
    if not unknown:
        return [*parts, tag], _one_of(tags), "nothing (the key is missing)"
    key = (difflib.get_close_matches(str(tag), map(str, unknown), n=1, cutoff=0) or unknown)[0]
    return ([*parts, key], f"the key {tag} ({_one_of(tags)})",
            f"unknown key {_show(key)} (did you mean {tag}?) = {_show(found[key])}")


def _follow_up(error: Any) -> bool:
    """A list's "too short after validation" that only echoes errors in its items."""
    ctx = error.get("ctx") or {}
    return error["type"] == "too_short" and len(error["input"]) >= ctx.get("min_length", 1)


def _one_of(choices: list[str]) -> str:
    return f"one of {', '.join(choices)}" if len(choices) > 1 else "".join(choices) or "nothing"


def _walk(loc: tuple[int | str, ...], root: Any) -> tuple[list[int | str], Any, Any]:
    """The key path to show for a pydantic ``loc``, and the types at its parent and at it."""
    parent = node = root
    parts: list[int | str] = []
    for part in loc:
        if part == "[key]":  # the mapping key itself is bad: the path ends at the key
            continue
        models = [v for v in _variants(node) if _is_model(v)]
        parent, tagged = node, [v for v in models if _tag(v) == part]
        if tagged and not any(part in v.model_fields for v in models):
            node = tagged[0]  # pydantic puts a union's tag in the loc; the file has no such key
            continue
        parts.append(part)
        fields = [v.model_fields[part].annotation for v in models if part in v.model_fields]
        args = [a for a in get_args(_bare(node)) if a is not Ellipsis]  # item or value type
        node = fields[0] if fields else (args[-1] if args else None)
    return parts, parent, node


def _bare(tp: Any) -> Any:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _variants(tp: Any) -> list[Any]:
    tp = _bare(tp)
    return [_bare(a) for a in get_args(tp)] if get_origin(tp) in (Union, types.UnionType) else [tp]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _tag(model: Any) -> str | None:
    field = model.model_fields.get("kind") if _is_model(model) else None
    return get_args(field.annotation)[0] if field else None


def _fields(tp: Any) -> list[str]:
    return [name for v in _variants(tp) if _is_model(v) for name in v.model_fields]


def _path(parts: list[int | str]) -> str:
    """``cases[2].n``; keys that are not plain words are quoted: ``modes["a/b"]``."""
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += (f".{p}" if out else p) if re.fullmatch(r"[\w-]+", p, re.A) else f"[{_show(p)}]"
    return out or "top level"


def _show(value: Any) -> str:
    """A found value as messages show it: YAML-like scalars, JSON-quoted strings, kinds."""
    if value is None or isinstance(value, (bool, int, float)):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value if len(value) <= 60 else value[:57] + "...")
    if isinstance(value, (Mapping, list, tuple)):
        kind = "mapping" if isinstance(value, Mapping) else "list"
        return f"a {kind}" if value else f"an empty {kind}"
    return f"a {type(value).__name__} {_show(str(value))}"


def _one_line(text: str) -> str:
    return " ".join(text.splitlines())
