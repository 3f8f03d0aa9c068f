"""Tests for runner.backends.docker.images: Dockerfile and build context rendering, tags named by
content."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate_residual_matrix.runner.backends.docker import images
from gate_residual_matrix.runner.config.matrix import DockerStack, parse_matrix
from gate_residual_matrix.runner.errors import ImageError

ROOT = Path(__file__).parent.parent
MATRIX = ROOT / "matrix.yaml"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of what the image bakes in (pyproject.toml, runner/, kernels/), to edit."""
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(ROOT / "pyproject.toml", root)
    for top in ("gate_residual_matrix", "containers"):
        shutil.copytree(ROOT / top, root / top, ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    path = tmp_path / "wheels"
    path.mkdir()
    (path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"wheel 1")
    (path / ".hidden").write_bytes(b"not copied")
    return path


def matrix_with(stack: dict[str, Any], pip: dict[str, Any] | None = None, **more: Any):
    data = yaml.safe_load(MATRIX.read_text())
    data["stacks"] = {"host": {"kind": "host"}, "s": stack, **more}
    data["pip"] = pip or {}
    return parse_matrix(data)


def stack(**fields: Any) -> dict[str, Any]:
    return {"kind": "docker", "base_image": "gate-residual/base:bookworm-py3.11",
            "python": "3.11", "torch": "2.13.0", **fields}


def render(matrix, project: Path, tmp: Path, name: str = "s") -> images.ImageSpec:
    return images.render(matrix, name, matrix_dir=tmp, project_root=project)


def test_pins_and_options_reach_requirements_pip_conf_and_labels(
        project: Path, wheelhouse: Path, tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    m = matrix_with(stack(torch="2.14.1", triton="3.8.0", sglang="0.5.23", numpy="2.4.6",
                          pip={"find_links": str(wheelhouse)}),
                    pip={"index_url": "https://pypi.org/simple", "ca_bundle": "ca.pem",
                         "extra_index_urls": ["https://a.example/simple",
                                              "file:///srv/simple"]})
    spec = render(m, project, tmp_path)
    req = spec.files["requirements.txt"].decode().splitlines()
    assert req[1:5] == ["torch==2.14.1", "triton==3.8.0", "sglang==0.5.23", "numpy==2.4.6"]
    assert "numpy<2.5" in req and "numba-cuda[cu13]>=0.30.4" in req  # pyproject's deps follow
    assert spec.files["pip.conf"].decode() == (
        "[global]\nindex-url = https://pypi.org/simple\n"
        "extra-index-url = https://a.example/simple file:///srv/simple\n"
        "find-links = /opt/wheelhouse\ncert = /etc/gate-residual/ca-bundle.crt\n")
    assert spec.files["ca-bundle.crt"] == b"-----BEGIN CERTIFICATE-----\n"  # matrix_dir/ca.pem
    assert sorted(k for k in spec.files if k.startswith("wheelhouse/")) == [
        "wheelhouse/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"]
    assert spec.pins == {"python": "3.11", "torch": "==2.14.1", "triton": "==3.8.0",
                         "sglang": "==0.5.23", "numpy": "==2.4.6"}
    assert spec.labels[f"{images.LABEL_PREFIX}pin.sglang"] == "==0.5.23"
    assert 'org.gate-residual-matrix.pin.torch="==2.14.1"' in spec.dockerfile
    assert "FROM gate-residual/base:bookworm-py3.11 AS runtime" in spec.dockerfile
    assert "python3.11 -m venv /opt/venv" in spec.dockerfile
    assert "COPY wheelhouse/ /opt/wheelhouse/" in spec.dockerfile
    assert "COPY ca-bundle.crt /etc/gate-residual/ca-bundle.crt" in spec.dockerfile
    assert spec.tag.startswith("gate-residual-matrix:s-") and len(spec.tag.split("-")[-1]) == 16


def test_without_options_nothing_optional_is_copied(project: Path, tmp_path: Path) -> None:
    spec = render(matrix_with(stack()), project, tmp_path)
    assert spec.files["pip.conf"] == b"[global]\n"
    assert "ca-bundle.crt" not in spec.files and not any(
        k.startswith("wheelhouse/") for k in spec.files)
    assert "COPY wheelhouse" not in spec.dockerfile and "COPY ca-bundle" not in spec.dockerfile


def instructions(dockerfile: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    joined = dockerfile.replace("\\\n", " ")
    return [line for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def test_dockerfile_has_no_buildkit_syntax_and_ends_non_root(project: Path,
                                                             tmp_path: Path) -> None:
    text = render(matrix_with(stack()), project, tmp_path).dockerfile
    steps = instructions(text)
    assert "@@" not in text and not text.startswith("# syntax=")
    assert not any("--mount" in s or "<<" in s for s in steps)
    assert [s.split()[0] for s in steps if s.startswith("FROM")] == ["FROM"] * 3
    users = [s for s in steps if s.startswith("USER ")]
    assert users[-1] == f"USER {images.IMAGE_UID}:{images.IMAGE_UID}"
    assert "COPY project/ /opt/gate-residual/" in steps
    copied = steps.index("COPY project/ /opt/gate-residual/")
    assert any(s.startswith("RUN python -m compileall -q /opt/gate-residual/gate_residual_matrix")
               for s in steps[copied:])  # bytecode made once: the image writes none at run time


def test_wheelhouse_stays_in_the_build_stage_else_the_image_goes_on_from_it(
        project: Path, wheelhouse: Path, tmp_path: Path) -> None:
    with_wheels = instructions(render(matrix_with(stack(pip={"find_links": str(wheelhouse)})),
                                      project, tmp_path).dockerfile)
    froms = [s for s in with_wheels if s.startswith("FROM")]
    assert froms[1:] == ["FROM runtime AS build", "FROM runtime"]
    assert "COPY --from=build /opt/venv /opt/venv" in with_wheels
    without = instructions(render(matrix_with(stack()), project, tmp_path).dockerfile)
    assert [s for s in without if s.startswith("FROM")][1:] == ["FROM runtime AS build",
                                                                "FROM build"]
    assert not any(s.startswith("COPY --from") for s in without)


def test_no_matrix_value_reaches_a_run_line_but_the_python_version(
        project: Path, tmp_path: Path) -> None:
    spec = render(matrix_with(stack(vllm=">=0.30,<0.31")), project, tmp_path)
    runs = " ".join(s for s in instructions(spec.dockerfile) if s.startswith("RUN"))
    assert "0.30" not in runs and "2.13.0" not in runs and "python3.11 -m venv" in runs
    assert '"<0.31,>=0.30"' in spec.dockerfile  # in a LABEL, quoted


def test_rendering_refuses_what_validation_would_have(project: Path, tmp_path: Path) -> None:
    """Defence in depth: a stack built without validation cannot put ``$`` in a Dockerfile."""
    bad = DockerStack.model_construct(kind="docker", base_image="x:1", python="3.11$(id)",
                                      torch="==2.13.0")
    with pytest.raises(ImageError, match="cannot go in a Dockerfile"):
        images.render_dockerfile("s", bad, labels={}, ca_bundle=False, wheelhouse=False)


def test_project_files_are_baked_in_without_caches(project: Path) -> None:
    (project / "gate_residual_matrix" / "runner" / "__pycache__").mkdir(exist_ok=True)
    pycache = project / "gate_residual_matrix" / "runner" / "__pycache__"
    (pycache / "x.cpython-311.pyc").write_bytes(b"x")
    (project / "gate_residual_matrix" / "kernels" / ".swp").write_text("x")
    names = [name for name, _ in images.project_files(project)]
    assert names[0] == "pyproject.toml" and "gate_residual_matrix/runner/cell/run.py" in names
    assert "gate_residual_matrix/runner/reports/schema/report.schema.json" in names
    assert "gate_residual_matrix/kernels/gate_residual.py" in names
    assert not any("__pycache__" in n or n.endswith(".pyc") or "/." in n for n in names)
    assert not any(n.startswith(("tests/", "containers/")) for n in names)


def test_tag_is_stable(project: Path, wheelhouse: Path, tmp_path: Path) -> None:
    m = matrix_with(stack(pip={"find_links": str(wheelhouse)}))
    first = render(m, project, tmp_path)
    assert render(m, project, tmp_path).tag == first.tag
    assert render(matrix_with(stack(pip={"find_links": str(wheelhouse)})), project,
                  tmp_path).tag == first.tag  # a fresh parse of the same content
    other_stack = matrix_with(stack(pip={"find_links": str(wheelhouse)}),
                              t={**stack(), "torch": "2.14.1"})
    assert render(other_stack, project, tmp_path).tag == first.tag  # other stacks: no effect
    data = yaml.safe_load(MATRIX.read_text())
    data["modes"]["det"] = {"torch": {"deterministic": True}}
    data["stacks"], data["pip"] = {"s": stack(pip={"find_links": str(wheelhouse)})}, {}
    assert render(parse_matrix(data), project, tmp_path).tag == first.tag  # modes: no effect


@pytest.mark.parametrize("change", [
    "pin", "pip option", "base image", "python", "wheel content", "new wheel", "project file",
    "new project file", "project dependency", "template"])
def test_tag_changes_with_what_the_image_is_made_of(
        change: str, project: Path, wheelhouse: Path, tmp_path: Path) -> None:
    fields = {"pip": {"find_links": str(wheelhouse)}}
    before = render(matrix_with(stack(**fields)), project, tmp_path).tag
    if change == "pin":
        fields["triton"] = "3.7.1"
    elif change == "pip option":
        fields["pip"] = {**fields["pip"], "index_url": "https://example.org/simple"}
    elif change == "base image":
        fields["base_image"] = "gate-residual/base:bookworm-py3.11@sha256:" + "0" * 64
    elif change == "python":
        fields["python"] = "3.12"
    elif change == "wheel content":
        next(wheelhouse.glob("*.whl")).write_bytes(b"wheel 2")
    elif change == "new wheel":
        (wheelhouse / "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"n")
    elif change == "project file":
        path = project / "gate_residual_matrix" / "kernels" / "gate_residual.py"
        path.write_text(path.read_text() + "\n# changed\n")
    elif change == "new project file":
        (project / "gate_residual_matrix" / "runner" / "new_module.py").write_text("X = 1\n")
    elif change == "project dependency":
        path = project / "pyproject.toml"
        path.write_text(path.read_text().replace('"tabulate>=0.9",', '"tabulate>=0.10",'))
    elif change == "template":
        template = project / "containers" / "Dockerfile.in"
        template.write_text(template.read_text() + "# changed\n")
    after = render(matrix_with(stack(**fields)), project, tmp_path).tag
    assert after != before, change


@pytest.mark.parametrize(("pip", "fragment"), [
    ({"find_links": "missing-dir"}, "pip.find_links"),
    ({"ca_bundle": "missing.pem"}, "pip.ca_bundle"),
])
def test_missing_host_paths_are_image_errors(project: Path, tmp_path: Path,
                                             pip: dict[str, str], fragment: str) -> None:
    with pytest.raises(ImageError, match=f'^stack "s": {fragment} .* is not a '):
        render(matrix_with(stack(pip=pip)), project, tmp_path)


def test_empty_wheelhouse_is_an_image_error(project: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ImageError, match="holds no file"):
        render(matrix_with(stack(pip={"find_links": "empty"})), project, tmp_path)


def test_host_stack_has_no_image(project: Path, tmp_path: Path) -> None:
    with pytest.raises(ImageError, match='stack "host": kind host has no image'):
        render(matrix_with(stack()), project, tmp_path, name="host")


def test_the_tag_names_what_the_context_holds(project: Path, wheelhouse: Path,
                                              tmp_path: Path) -> None:
    """Files edited after rendering: project files were read already; a wheel is refused."""
    spec = render(matrix_with(stack(pip={"find_links": str(wheelhouse)})), project, tmp_path)
    (project / "gate_residual_matrix" / "runner" / "cell.py").write_text(
        "# edited after the tag was computed\n")
    edited = spec.files["project/gate_residual_matrix/runner/cell/run.py"]
    assert edited != b"# edited after the tag was computed\n"
    spec.write_context(io.BytesIO())
    next(wheelhouse.glob("*.whl")).write_bytes(b"another wheel")
    with pytest.raises(ImageError, match=r"changed after image .* was named"):
        spec.write_context(io.BytesIO())


def test_context_tar_holds_every_file_read_only(project: Path, wheelhouse: Path,
                                                tmp_path: Path) -> None:
    spec = render(matrix_with(stack(pip={"find_links": str(wheelhouse)})), project, tmp_path)
    buffer = io.BytesIO()
    spec.write_context(buffer)
    buffer.seek(0)
    with tarfile.open(fileobj=buffer) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert tar.extractfile("Dockerfile").read().decode() == spec.dockerfile
        wheel = "wheelhouse/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
        assert tar.extractfile(wheel).read() == b"wheel 1"
    assert set(members) == {"Dockerfile", *spec.files}
    assert {m.mode for m in members.values()} == {0o644}
