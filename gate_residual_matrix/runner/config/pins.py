"""Checks for the strings a docker stack carries into a Dockerfile or pip's configuration.

Used by :mod:`runner.config.matrix` (``kind: docker`` stacks and the ``pip:`` section), so every
value is checked once, when matrix.yaml is read, before anything is rendered:

- package versions: a PEP 440 exact version (``"2.13.0"``, taken as ``==2.13.0``) or a
  specifier set (``"==2.13.0"``, ``">=0.30,<0.31"``), parsed with :mod:`packaging`;
- the Python version: ``3.<minor>``, the interpreter the image runs (``python3.<minor>``);
- an image reference: ``name:tag`` with an optional ``@sha256:<64 hex>`` digest, the tag
  required (no implicit ``latest``);
- URLs and paths: no whitespace, quotes, shell metacharacters or ``..`` components.

Each check returns the normalised value or raises ``PydanticCustomError("matrix", ...)``
with ``expected``, which the config loader turns into one line such as
``matrix.yaml: stacks.cpu.torch: expected a version like "2.13.0" or a specifier like
">=2.13,<2.14", got "2.13.0; rm -rf /"``.

Example::

    >>> version_spec("2.13.0"), version_spec(">=0.30, <0.31")
    ('==2.13.0', '<0.31,>=0.30')
"""

from __future__ import annotations

import re

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic_core import PydanticCustomError

__all__ = ["SHELL_UNSAFE", "image_ref", "pip_url", "python_version", "safe_path",
           "version_spec"]

#: Characters refused in any string that reaches a Dockerfile or pip.conf: whitespace,
#: quotes, backslash and everything a POSIX shell gives a meaning to.
SHELL_UNSAFE = frozenset(" \t\n\r\v\f\0'\"`\\$;&|<>(){}[]*?!~#^")

_VERSION_WORDS = 'a version like "2.13.0" or a specifier like ">=2.13,<2.14"'
# registry host[:port]/ path components / name, :tag, optional @sha256 digest
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_RE = re.compile(
    rf"^(?:(?P<registry>[A-Za-z0-9.-]+(?::[0-9]+)?)/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r":(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")
_URL_RE = re.compile(r"^(https?|file)://[A-Za-z0-9._~:/%+,=@-]+$")
_SPEC_RE = re.compile(r"^[A-Za-z0-9.*+!<>=~,]+$")
_PATH_RE = re.compile(r"^[A-Za-z0-9._/+,=@-]+$")


def _fail(expected: str) -> PydanticCustomError:
    return PydanticCustomError("matrix", "bad value", {"expected": expected})


def _printable(value: str) -> None:
    if not value or any(c in SHELL_UNSAFE for c in value):
        raise _fail("no whitespace, quotes or shell metacharacters")


def version_spec(value: str) -> str:
    """``value`` as a normalised specifier set: an exact version becomes ``==<version>``.

    Raises PydanticCustomError for anything :mod:`packaging` does not parse, an empty
    string, or a specifier set that names no operator (``","``).

    Example::

        >>> version_spec("0.30.0"), version_spec("~=3.8.0"), version_spec("2.13.0+cpu")
        ('==0.30.0', '~=3.8.0', '==2.13.0+cpu')
    """
    if not value.strip() or any(c in value for c in "\n\r\t\0"):
        raise _fail(_VERSION_WORDS)
    text = value.strip()
    try:
        spec = str(_specifiers(text)) if text[0] in "<>=!~" else f"=={Version(text)}"
    except (InvalidVersion, InvalidSpecifier):
        raise _fail(_VERSION_WORDS) from None
    if "===" in spec or not _SPEC_RE.fullmatch(spec):  # === takes any text: refused
        raise _fail(_VERSION_WORDS + ' (no "===")')
    return spec


def _specifiers(text: str) -> SpecifierSet:
    spec = SpecifierSet(text)
    if not len(spec):
        raise InvalidSpecifier(text)
    return spec


def python_version(value: str) -> str:
    """``"3.<minor>"`` (3.8 to 3.19): the interpreter ``python3.<minor>`` the image runs.

    Example::

        >>> python_version("3.11")
        '3.11'
    """
    if not re.fullmatch(r"3\.(?:[89]|1[0-9])", value):
        raise _fail('a Python version "3.<minor>" such as "3.11" or "3.12"')
    return value


def image_ref(value: str) -> str:
    """A Docker image reference with an explicit tag, optionally ``@sha256:<digest>``.

    Example::

        >>> image_ref("nvidia/cuda:13.0.1-runtime-ubuntu24.04")
        'nvidia/cuda:13.0.1-runtime-ubuntu24.04'
    """
    if not _IMAGE_RE.fullmatch(value):
        raise _fail('an image "name:tag" or "name:tag@sha256:<64 hex digits>" (lower-case '
                    'name, tag required)')
    return value


def pip_url(value: str) -> str:
    """An index URL: ``https://``, ``http://`` or ``file://`` with no shell metacharacters.

    Credentials in the URL are refused (``user:pass@``): they would be baked into the
    image; give pip a netrc or keyring outside the image instead.
    """
    _printable(value)
    if not _URL_RE.fullmatch(value):
        raise _fail("an http(s):// or file:// URL of letters, digits and ._~:/%+,=@-")
    if "@" in value.split("://", 1)[1].split("/", 1)[0]:
        raise _fail("a URL without credentials (user:password@ would be baked into the image)")
    return value


def safe_path(value: str) -> str:
    """A host path (relative to matrix.yaml's directory or absolute) with no ``..``.

    Existence is checked when the image is rendered, not here.

    Example::

        >>> safe_path("/opt/wheels")
        '/opt/wheels'
    """
    _printable(value)
    if not _PATH_RE.fullmatch(value):
        raise _fail("a path of letters, digits and ._/+,=@-")
    if ".." in value.split("/"):
        raise _fail('a path without ".." components')
    return value
