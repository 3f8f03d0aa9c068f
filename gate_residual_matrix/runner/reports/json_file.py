"""A report file's JSON, or one line saying why it has none (:func:`load`).

:func:`runner.reports.store.read_report` reads every file through here before it looks at what the
JSON says: the file must be a regular file of at most :data:`MAX_REPORT_BYTES`, UTF-8, JSON
(``NaN``/``Infinity`` constants accepted, then flagged as not finite), with no lone UTF-16
surrogate that could not be written out again. Truncated and corrupt JSON are told apart, so
the tables can say which.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from gate_residual_matrix.runner.errors import ReportError
from gate_residual_matrix.runner.untrusted import files

MAX_REPORT_BYTES = 256 * 2**20
"""The largest report file read (a report of today's matrix is about 340 KB)."""

_MAX_MESSAGE = 240
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_CONSTANTS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _parse(text: str) -> tuple[Any, bool]:
    """The JSON value of ``text``, and whether every number in it is finite (then the walk
    over every value, :func:`~runner.reports.checks.json_problems`, has nothing to find:
    parsed JSON has string keys and JSON types only).

    Raises:
        json.JSONDecodeError, RecursionError, ValueError: as :func:`json.loads`.
    """
    finite = True

    def constant(name: str) -> float:
        nonlocal finite
        finite = False
        return _CONSTANTS[name]

    def number(literal: str) -> float:
        nonlocal finite
        value = float(literal)
        if finite and not math.isfinite(value):  # 1e999
            finite = False
        return value

    return json.loads(text, parse_constant=constant, parse_float=number), finite


def _decode_problem(text: str, err: json.JSONDecodeError) -> str:
    if not text.strip():
        return "truncated: the file is empty"
    msg = err.msg.removesuffix(" at")  # json's "Invalid control character at"
    if err.pos >= len(text.rstrip()) or err.msg.startswith("Unterminated string"):
        return f"truncated JSON: {msg} at line {err.lineno} column {err.colno}"
    return f"corrupt JSON: {msg} at line {err.lineno} column {err.colno}"


def _read_regular_file(path: Path) -> bytes:
    """The bytes of a report file: a regular file of at most :data:`MAX_REPORT_BYTES`,
    never blocking on a FIFO or device (:func:`runner.untrusted.files.read_bounded`).

    Raises:
        ReportError: not a regular file, or too large (one line).
        OSError: cannot be opened or read (a symlink loop: ``ELOOP``).
    """
    try:
        return files.read_bounded(path, MAX_REPORT_BYTES)
    except files.NotRegular as err:
        raise ReportError(f"not a report: {err.kind}, not a regular file") from err
    except files.TooLarge as err:
        got = "more" if err.size is None else err.size
        raise ReportError(f"not read: {got} bytes, more than the {MAX_REPORT_BYTES} a report "
                          "may have") from err


def load(path: Path) -> tuple[Any, bool]:
    """The JSON value of the file at ``path`` (any JSON type) and whether every number in it
    is finite.

    Raises:
        ReportError: one line, for a file that is not a regular file, too large, unreadable,
            not UTF-8, empty or truncated, corrupt JSON, nested too deeply, or holding a lone
            UTF-16 surrogate escape.
    """
    try:
        text = _read_regular_file(path).decode("utf-8")
    except UnicodeDecodeError as err:
        raise ReportError(f"corrupt: not UTF-8 text ({err.reason})") from None
    except OSError as err:
        raise ReportError(f"cannot read: {err.strerror or err}") from None
    try:
        data, finite = _parse(text)
    except json.JSONDecodeError as err:
        raise ReportError(_decode_problem(text, err)) from None
    except RecursionError:
        raise ReportError("corrupt JSON: nested too deeply") from None
    except ValueError as err:  # e.g. an integer of more digits than Python converts
        line = " ".join(f"corrupt JSON: {err}".split())
        raise ReportError(line if len(line) <= _MAX_MESSAGE
                          else line[:_MAX_MESSAGE - 1] + "…") from None
    if _SURROGATE_ESCAPE.search(text):  # a lone surrogate escape cannot be written out again
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ReportError("corrupt: a string holds a lone UTF-16 surrogate (\\ud800-"
                              "\\udfff), which no UTF-8 text can carry") from None
    return data, finite
