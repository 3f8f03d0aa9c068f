"""Make a base image without a registry: debootstrap a Debian root file system, docker import.

Where no registry answers (air-gapped clusters, our development machines), ``FROM`` a public
image fails. :func:`make` builds one locally instead:

1. ``debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates
   <suite> <dir> <mirror>`` (needs root and the Debian mirror; about 45 s and 300 MB for
   bookworm, whose Python is 3.11);
2. apt's package cache and lists are emptied (they only make the image larger);
3. ``tar`` of that directory is imported with docker-py (``docker import``), with PATH, LANG
   and a shell as CMD set by ``changes``.

A stack then names it as ``base_image`` (``gate-residual/base:bookworm-py3.11`` in the shipped
matrix.yaml). An image imported this way has no registry digest; the reports record its
image id (``image.base_id``). The two subprocesses (debootstrap, tar) live here, not in the
host backend, because they make an image rather than run a cell.

Example::

    $ python -m gate_residual_matrix base-image      # as root; nox -s base_image does the same
    [runner] base image gate-residual/base:bookworm-py3.11: sha256:... (made in 52 s)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from gate_residual_matrix.runner.backends.docker.cells import DockerBackend
from gate_residual_matrix.runner.config import pins
from gate_residual_matrix.runner.errors import ConfigError, ImageError

__all__ = ["DEFAULT_NAME", "PACKAGES", "debootstrap_command", "make"]

DEFAULT_NAME = "gate-residual/base:bookworm-py3.11"
PACKAGES = ("python3", "python3-venv", "python3-pip", "ca-certificates")
CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["/bin/bash"]',
)


def debootstrap_command(root: Path, *, suite: str = "bookworm",
                        mirror: str = "http://deb.debian.org/debian",
                        packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """The debootstrap argv (a list: no shell).

    Example::

        >>> debootstrap_command(Path("/tmp/r"))[:3]
        ['debootstrap', '--variant=minbase', '--include=python3,python3-venv,python3-pip,ca-certificates']
    """  # noqa: E501
    return ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite,
            str(root), mirror]


def make(name: str = DEFAULT_NAME, *, suite: str = "bookworm",
         mirror: str = "http://deb.debian.org/debian", force: bool = False,
         backend: DockerBackend | None = None, workdir: Path | None = None) -> str:
    """Make base image ``name`` (see the module docstring) unless it exists; return its id.

    Raises:
        ConfigError: ``name`` is not ``name:tag``, or ``suite`` / ``mirror`` have
            characters a command line should not carry.
        ImageError: not root, no debootstrap, debootstrap or tar failed, no engine, or
            the import failed.
    """
    try:
        pins.image_ref(name)
        pins.pip_url(mirror)
        pins.safe_path(suite)
    except ValueError as err:  # PydanticCustomError is a ValueError
        raise ConfigError(f"base-image: {name!r} / {suite!r} / {mirror!r}: {err}") from err
    backend = backend or DockerBackend()
    why = backend.available()
    if why:
        raise ImageError(f"base-image: {why}")
    found = backend.image_id(name)
    if found and not force:
        print(f"[runner] base image {name}: {found} (exists; --force makes it again)")
        return found
    if os.geteuid() != 0:
        raise ImageError("base-image: debootstrap needs root (run as root, e.g. in CI)")
    if shutil.which("debootstrap") is None:
        raise ImageError("base-image: debootstrap is not installed (apt-get install debootstrap)")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gate-residual-rootfs-", dir=workdir) as tmp:
        root, tar = Path(tmp) / "rootfs", Path(tmp) / "rootfs.tar"
        print(f"[runner] base image {name}: debootstrap {suite} from {mirror}", flush=True)
        _run(debootstrap_command(root, suite=suite, mirror=mirror), "debootstrap")
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (root / cache).glob("*"):
                if entry.is_file():
                    entry.unlink()
        _run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(tar), "."], "tar")
        image_id = backend.import_rootfs(tar, name, changes=CHANGES)
    print(f"[runner] base image {name}: {image_id} (made in "
          f"{time.perf_counter() - started:.0f} s)", flush=True)
    return image_id


def _run(argv: list[str], what: str) -> None:
    """Run ``argv``, its output going to ours; ImageError with the tail when it fails."""
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace")
    if done.returncode != 0:
        tail = " | ".join(done.stdout.strip().splitlines()[-5:])
        raise ImageError(f"base-image: {what} exited with code {done.returncode}: {tail}")
