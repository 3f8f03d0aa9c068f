"""Compiled extension files of a library's wheel, kept beside the kernel wheelhouse on request
(``python -m gate_residual_matrix.runner.wheelhouse --extensions``; off by default: tens of MB
each).

Layout, one folder per distribution version::

    <root>/<distribution>-<version>/<file name>        e.g. vllm-0.30.0/_C_stable_libtorch.abi3.so
    <root>/<distribution>-<version>/extension.json     what it is and where it came from

``extension.json``: the distribution and version, the wheel (file name, sha256, size), the
file's path in the wheel, its sha256 (checked against the wheel's RECORD when kept, and
against this record before every load), its size, and the torch the wheel requires
(``Requires-Dist: torch`` of its METADATA, e.g. ``==2.13.0``), so a report can say that the
extension ran under another torch. No torch import here: the wheelhouse is built where only
pip and PyYAML are installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from pathlib import Path

from gate_residual_matrix.contract.wheel_record import WheelhouseError, parse_record, sha256_file

SCHEMA = 1


class ExtensionMissing(RuntimeError):
    """No usable kept extension file; the message is one line and says how to get one."""


def directory(root: Path, distribution: str, version: str) -> Path:
    """The folder of ``distribution`` ``version``'s extension files under ``root``."""
    return Path(root) / f"{distribution}-{version}"


def torch_requirement(metadata: str) -> str | None:
    """The version specifier of ``Requires-Dist: torch`` in a wheel's METADATA (``==2.13.0``;
    ``""`` when unpinned), or None when the wheel does not require torch."""
    for line in metadata.splitlines():
        found = re.match(r"Requires-Dist:\s*torch(?![A-Za-z0-9_.-])\s*\(?([^;)]*)\)?", line)
        if found:
            return found.group(1).strip()
    return None


def keep(wheel: Path, manifest: dict, path: str, root: Path) -> dict:
    """Copy ``path`` out of ``wheel`` (whose kernel ``manifest`` :func:`runner.wheelhouse.
    extract` just wrote) into :func:`directory`, checked against the wheel's RECORD, and
    write its ``extension.json``; that record. :class:`WheelhouseError` (one line) when the
    wheel lacks the file or its bytes do not match RECORD."""
    label = f"{manifest['distribution']} {manifest['version']}"
    folder = directory(root, manifest["distribution"], manifest["version"])
    dest = folder / Path(path).name
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        if path not in names:
            raise WheelhouseError(f"{wheel.name} has no {path} ({label})")
        record = parse_record(zf.read(manifest["record"]["path"]).decode("utf-8"))
        metadata = next((zf.read(n).decode("utf-8", "replace") for n in sorted(names)
                         if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)), "")
        folder.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".tmp")
        digest, size = hashlib.sha256(), 0
        with zf.open(path) as src, open(tmp, "wb") as out:
            while block := src.read(1 << 20):
                digest.update(block)
                size += len(block)
                out.write(block)
    if record.get(path) != digest.hexdigest():
        tmp.unlink()
        raise WheelhouseError(f"{wheel.name}: {path} does not match the wheel's RECORD")
    os.replace(tmp, dest)
    info = {"schema": SCHEMA, "distribution": manifest["distribution"],
            "version": manifest["version"], "wheel": dict(manifest["wheel"]), "path": path,
            "sha256": digest.hexdigest(), "size": size,
            "requires_torch": torch_requirement(metadata)}
    (folder / "extension.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    return info


def kept(root: Path, distribution: str, version: str, path: str) -> tuple[Path, dict]:
    """``(file, extension.json record)`` of ``path`` kept for ``distribution`` ``version``
    under ``root``, its sha256 checked. :class:`ExtensionMissing` (one line) when it was not
    fetched, its record is unreadable or names another file, or its bytes differ."""
    folder = directory(root, distribution, version)
    name = Path(path).name
    fetch = ("fetch it with `python -m gate_residual_matrix.runner.wheelhouse --extensions` "
             "and carry it")
    meta = folder / "extension.json"
    if not meta.is_file():
        raise ExtensionMissing(f"no {name} of {distribution} {version} beside the kernel "
                               f"wheelhouse ({folder}): {fetch}")
    try:
        info = json.loads(meta.read_text())
    except (OSError, ValueError) as err:
        raise ExtensionMissing(f"{meta}: unreadable: {err}".splitlines()[0]) from None
    if info.get("path") != path:
        raise ExtensionMissing(f"{meta} records {info.get('path')!r}, not {path}: {fetch}")
    file = folder / name
    try:
        got = sha256_file(file)
    except OSError:
        raise ExtensionMissing(f"{file} is missing although {meta.name} names it: "
                               f"{fetch}") from None
    if got != info.get("sha256"):
        raise ExtensionMissing(f"{file} does not match its extension.json (sha256 {got}, "
                               f"recorded {info.get('sha256')})")
    return file, info
