"""Render a docker stack's image: Dockerfile, build context and a tag named by content.

:func:`render` turns one ``kind: docker`` stack of the matrix into an :class:`ImageSpec`:
the Dockerfile rendered from ``containers/Dockerfile.in``, the files of the build context
(``pip.conf``, ``requirements.txt``, the CA bundle, the wheelhouse, this project's
``pyproject.toml``, ``runner/`` and ``kernels/``), the labels recording the pins, and the
tag ``gate-residual-matrix:<stack>-<16 hex>``, where the hex is the start of the sha256 over
the Dockerfile, the build args and every file of the context. An unchanged stack therefore
keeps its tag and is not rebuilt; a changed pin, pip option, wheel or project file gives a
new tag. No docker-py call lives here (see :mod:`runner.backends.docker`).

Example::

    >>> from gate_residual_matrix.runner.config.matrix import load_matrix
    >>> spec = render(load_matrix("matrix.yaml"), "cpu-torch2.13", matrix_dir=Path("."))
    >>> spec.tag.startswith("gate-residual-matrix:cpu-torch2.13-"), len(spec.content_hash)
    (True, 64)
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gate_residual_matrix.runner.config.matrix import DockerStack, Matrix, PipOptions
from gate_residual_matrix.runner.errors import ImageError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["IMAGE_UID", "REPOSITORY", "TEMPLATE", "ImageSpec", "pip_conf", "project_files",
           "render", "render_dockerfile", "requirements"]

REPOSITORY = "gate-residual-matrix"
PROJECT_ROOT = Path(__file__).resolve().parents[4]
TEMPLATE = PROJECT_ROOT / "containers" / "Dockerfile.in"
IMAGE_UID = 10001  # the image's non-root user and group (containers/Dockerfile.in)
PROJECT_PATHS = ("pyproject.toml", "gate_residual_matrix")  # baked into /opt/gate-residual
LABEL_PREFIX = "org.gate-residual-matrix."
_PLACEHOLDER = re.compile(r"@@([A-Z_]+)@@")
_DIGESTS: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256 hex


@dataclass(frozen=True)
class ImageSpec:
    """Everything needed to build one stack's image, and its content-derived tag.

    ``files`` maps each path in the build context to its bytes or to the host file that
    holds them (``file_digests``: the sha256 of each such host file when rendered, which the
    tag was computed from). ``pins`` is the stack's ``{distribution: specifier}``, python
    first.
    """

    stack: str
    tag: str
    content_hash: str
    dockerfile: str
    base_image: str
    pins: Mapping[str, str]
    labels: Mapping[str, str]
    files: Mapping[str, bytes | Path] = field(repr=False)
    file_digests: Mapping[str, str] = field(default_factory=dict, repr=False)  # host files
    buildargs: Mapping[str, str] = field(default_factory=dict)

    def write_context(self, fileobj: IO[bytes]) -> None:
        """Write the build context as an uncompressed tar to ``fileobj`` (Dockerfile first).

        Files are owned by root, mode 0644 (directories 0755), so the image's user reads
        them and cannot change them. Small files were read when the spec was rendered; a
        wheel (a host file) must still have the content the tag was computed from.

        Raises:
            ImageError: a wheel changed since :func:`render` (render again).
        """
        with tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT) as tar:
            entries = {"Dockerfile": self.dockerfile.encode(), **self.files}
            for name, content in entries.items():
                info = tarfile.TarInfo(name)
                info.mode, info.mtime = 0o644, 0
                if isinstance(content, bytes):
                    info.size = len(content)
                    tar.addfile(info, io.BytesIO(content))
                    continue
                if _file_digest(content) != self.file_digests[name]:
                    raise ImageError(f"{content} changed after image {self.tag} was named: "
                                     "render the stack again")
                info.size = content.stat().st_size
                with open(content, "rb") as f:
                    tar.addfile(info, f)


def render(matrix: Matrix, stack_name: str, *, matrix_dir: Path,
           project_root: Path = PROJECT_ROOT) -> ImageSpec:
    """The :class:`ImageSpec` of docker stack ``stack_name`` of ``matrix``.

    ``matrix_dir`` resolves relative ``find_links`` / ``ca_bundle`` paths. The stack's
    ``pip:`` options go on top of the matrix's (key by key). ``project_root`` holds the
    template (``containers/Dockerfile.in``) and the files baked in.

    Raises:
        ImageError: the stack is not ``kind: docker``; the wheelhouse is not a directory
            or holds no file; the CA bundle is not a file; the template or pyproject.toml
            cannot be read.

    Example::

        >>> render(matrix, "host", matrix_dir=Path("."))
        Traceback (most recent call last):
        runner.errors.ImageError: stack "host": kind host has no image
    """
    stack = matrix.stacks[stack_name]
    if not isinstance(stack, DockerStack):
        raise ImageError(f'stack "{stack_name}": kind {stack.kind} has no image')
    options = stack.pip.over(matrix.pip)
    files: dict[str, bytes | Path] = {}
    ca = _host_path(options.ca_bundle, matrix_dir, stack_name, "pip.ca_bundle", file=True)
    if ca is not None:
        files["ca-bundle.crt"] = ca.read_bytes()
    wheelhouse = _host_path(options.find_links, matrix_dir, stack_name, "pip.find_links",
                            file=False)
    if wheelhouse is not None:
        wheels = sorted(p for p in wheelhouse.iterdir()
                        if p.is_file() and not p.name.startswith("."))
        if not wheels:
            raise ImageError(f'stack "{stack_name}": pip.find_links {wheelhouse} holds no file')
        files.update({f"wheelhouse/{p.name}": p for p in wheels})
    files["pip.conf"] = pip_conf(options, wheelhouse=wheelhouse is not None,
                                 ca_bundle=ca is not None).encode()
    deps = _project_dependencies(project_root / "pyproject.toml")
    files["requirements.txt"] = requirements(stack_name, stack, deps).encode()
    # read now: the tag must name exactly what the image gets, even if a file is edited later
    files.update({f"project/{rel}": path.read_bytes() for rel, path in project_files(project_root)})
    pins = stack.pins()
    labels = {f"{LABEL_PREFIX}stack": stack_name, f"{LABEL_PREFIX}base-image": stack.base_image,
              **{f"{LABEL_PREFIX}pin.{name}": spec for name, spec in pins.items()}}
    dockerfile = render_dockerfile(stack_name, stack, labels=labels, ca_bundle=ca is not None,
                                   wheelhouse=wheelhouse is not None,
                                   template=project_root / TEMPLATE.relative_to(PROJECT_ROOT))
    host_files = {name: _file_digest(p) for name, p in files.items() if isinstance(p, Path)}
    digest = _content_hash(dockerfile, files, {}, host_files)
    return ImageSpec(stack=stack_name, tag=f"{REPOSITORY}:{stack_name}-{digest[:16]}",
                     content_hash=digest, dockerfile=dockerfile, base_image=stack.base_image,
                     pins=pins, labels=labels, files=files, file_digests=host_files)


def render_dockerfile(stack_name: str, stack: DockerStack, *, labels: Mapping[str, str],
                      ca_bundle: bool, wheelhouse: bool, template: Path = TEMPLATE) -> str:
    """The Dockerfile: the template's ``@@NAME@@`` placeholders filled in.

    Values come from a validated stack (no quotes, ``$`` or newlines), labels are written
    as JSON strings. Raises ImageError when the template cannot be read or names a
    placeholder this function does not know.
    """
    try:
        text = template.read_text(encoding="utf-8")
    except OSError as err:
        raise ImageError(f"cannot read the Dockerfile template {template}: "
                         f"{err.strerror or err}") from err
    ca_lines = ("COPY ca-bundle.crt /etc/gate-residual/ca-bundle.crt\n"
                "ENV PIP_CERT=/etc/gate-residual/ca-bundle.crt "
                "SSL_CERT_FILE=/etc/gate-residual/ca-bundle.crt "
                "REQUESTS_CA_BUNDLE=/etc/gate-residual/ca-bundle.crt")
    values = {
        "STACK": stack_name,
        "BASE_IMAGE": stack.base_image,
        "PYTHON": stack.python,
        "CA_BUNDLE": ca_lines if ca_bundle else "# (no CA bundle: pip trusts the image's own)",
        "WHEELHOUSE": ("COPY wheelhouse/ /opt/wheelhouse/" if wheelhouse
                       else "# (no wheelhouse: pip.find_links not set)"),
        # A wheelhouse stays behind in the build stage; without one the image simply goes on
        # from the build stage, so the venv (GBs) is stored once, not copied into a new stage.
        "FINAL_STAGE": ("FROM runtime\nCOPY --from=build /opt/venv /opt/venv" if wheelhouse
                        else "FROM build"),
        "LABELS": "LABEL " + " \\\n      ".join(f"{k}={json.dumps(v)}"
                                                for k, v in labels.items()),
    }
    for value in values.values():
        if "$" in value or "\0" in value:  # Dockerfile would substitute or break: refused
            raise ImageError(f'stack "{stack_name}": value {value!r} cannot go in a Dockerfile')

    def fill(match: re.Match[str]) -> str:
        if match.group(1) not in values:
            raise ImageError(f"{template}: unknown placeholder {match.group(0)}")
        return values[match.group(1)]

    return _PLACEHOLDER.sub(fill, text)


def pip_conf(options: PipOptions, *, wheelhouse: bool, ca_bundle: bool) -> str:
    """``/etc/gate-residual/pip.conf`` for the build stage (``PIP_CONFIG_FILE``).

    Example::

        >>> print(pip_conf(PipOptions(index_url="https://pypi.org/simple"),
        ...                wheelhouse=True, ca_bundle=False), end="")
        [global]
        index-url = https://pypi.org/simple
        find-links = /opt/wheelhouse
    """
    lines = ["[global]"]
    if options.index_url:
        lines.append(f"index-url = {options.index_url}")
    if options.extra_index_urls:
        lines.append(f"extra-index-url = {' '.join(options.extra_index_urls)}")
    if wheelhouse:
        lines.append("find-links = /opt/wheelhouse")
    if ca_bundle:
        lines.append("cert = /etc/gate-residual/ca-bundle.crt")
    return "\n".join(lines) + "\n"


def requirements(stack_name: str, stack: DockerStack, project_deps: Iterable[str]) -> str:
    """``requirements.txt``: the stack's pins, ``numpy<2.5``, then the project's dependencies.

    pip resolves them in one go, so a pin that contradicts another (torch 2.14.1 with
    triton 3.7.1) fails the build, which the cells of that stack report as ``build_error``.

    Example::

        >>> print(requirements("s", DockerStack(kind="docker", base_image="b:1",
        ...                                     python="3.11", torch="2.13.0"), []), end="")
        # stack s: pins from matrix.yaml, then gate-residual-matrix's dependencies
        torch==2.13.0
        numpy<2.5
    """
    pins = {k: v for k, v in stack.pins().items() if k != "python"}
    lines = [f"# stack {stack_name}: pins from matrix.yaml, then gate-residual-matrix's "
             "dependencies"]
    lines += [f"{name}{spec}" for name, spec in pins.items()]
    lines.append("numpy<2.5")  # numba-cuda 0.30 fails at first compile with numpy 2.5
    lines += list(project_deps)
    return "\n".join(dict.fromkeys(lines)) + "\n"  # each line once, first place kept


def project_files(root: Path = PROJECT_ROOT) -> list[tuple[str, Path]]:
    """``(path relative to root, file)`` for what the image bakes in, sorted.

    ``pyproject.toml`` and every file under ``runner/`` and ``kernels/`` except
    ``__pycache__``, ``*.pyc`` and hidden files.
    """
    found: list[tuple[str, Path]] = []
    for top in PROJECT_PATHS:
        path = root / top
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        for p in candidates:
            rel = p.relative_to(root)
            if (p.is_file() and p.suffix != ".pyc" and "__pycache__" not in rel.parts
                    and not any(part.startswith(".") for part in rel.parts)):
                found.append((rel.as_posix(), p))
    return found


def _project_dependencies(pyproject: Path) -> list[str]:
    """``[project].dependencies`` of pyproject.toml (the image's runtime requirements)."""
    try:
        with pyproject.open("rb") as f:
            return list(tomllib.load(f)["project"]["dependencies"])
    except (OSError, KeyError, tomllib.TOMLDecodeError) as err:
        raise ImageError(f"{pyproject}: cannot read [project].dependencies: {err}") from err


def _host_path(value: str | None, base: Path, stack: str, key: str, *,
               file: bool) -> Path | None:
    if value is None:
        return None
    path = Path(value) if Path(value).is_absolute() else base / value
    if not (path.is_file() if file else path.is_dir()):
        kind = "file" if file else "directory"
        raise ImageError(f'stack "{stack}": {key} {path} is not a {kind}')
    return path


def _file_digest(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def _content_hash(dockerfile: str, files: Mapping[str, bytes | Path],
                  buildargs: Mapping[str, str], host_files: Mapping[str, str]) -> str:
    """sha256 hex over the Dockerfile, the build args and (name, sha256) of every file
    (``host_files``: the digests of the files given as paths)."""
    listing = [[name, hashlib.sha256(c).hexdigest() if isinstance(c, bytes) else
                host_files[name]] for name, c in sorted(files.items())]
    doc = {"dockerfile": dockerfile, "buildargs": dict(sorted(buildargs.items())),
           "files": listing}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
