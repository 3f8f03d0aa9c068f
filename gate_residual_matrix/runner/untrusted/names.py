"""Names (file names, paths, strings from a file) as they are shown to a user: every line we
print and every table we write holds them escaped, so that a name cannot break a line,
forge a second one, drive the terminal or fail to encode.

Escaped: bytes that are not UTF-8 (Python keeps them as lone surrogates, ``\\udcff``:
shown ``\\xff``), control characters C0, DEL and C1 (``\\n``, ``\\r``, ``\\t``, ``\\x1b``...),
the Unicode line and paragraph separators and the bidirectional controls that reorder what
a reader sees. Everything else, backslashes included, is left as it is.

Example::

    >>> shown(b"notes-\\xff\\xfe.json")
    'notes-\\\\xff\\\\xfe.json'
    >>> shown("a\\nwarning: forged\\x1b[31m")
    'a\\\\nwarning: forged\\\\x1b[31m'
"""

from __future__ import annotations

import os
import re

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
                     "\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    code = ord(ch)
    if ch in _NAMED:
        return _NAMED[ch]
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(name: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> str:
    """``name`` as one safe line of text (see the module's docstring); bytes are read as
    UTF-8 with the other bytes escaped. Never raises."""
    if isinstance(name, os.PathLike):
        name = os.fspath(name)
    if isinstance(name, bytes):
        name = name.decode("utf-8", "surrogateescape")
    return _UNSAFE.sub(_escape, name)
