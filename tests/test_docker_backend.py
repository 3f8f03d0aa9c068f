"""Tests for runner.backends.docker without an engine: container arguments, the container's
life (fake engine), build failures, and which backend runs which cell (runner.backends)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from gate_residual_matrix.runner.backends import registry as backends
from gate_residual_matrix.runner.backends.docker import engine as docker_backend
from gate_residual_matrix.runner.backends.docker.cells import DockerBackend
from gate_residual_matrix.runner.backends.docker.container import (
    CONTAINER_MATRIX,
    CONTAINER_REPORTS,
    cell_command,
    container_config,
    gpu_request,
)
from gate_residual_matrix.runner.backends.docker.images import IMAGE_UID, render
from gate_residual_matrix.runner.config.matrix import parse_matrix
from gate_residual_matrix.runner.errors import BackendError, ConfigError, Interrupted
from gate_residual_matrix.runner.plan.cells import Cell
from gate_residual_matrix.runner.reports.store import read_report

ROOT = Path(__file__).parent.parent
MATRIX = ROOT / "matrix.yaml"


def config(target: str = "cuda", gpus: str = "all", tmp: Path = Path("/tmp/x"), **kw: Any):
    cell = Cell("torch2.13-vllm0.30", "det", target)
    args = {"cell": cell, "run_id": "0123456789abcdef", "mode_env": {"CUBLAS_WORKSPACE_CONFIG":
                                                                      ":4096:8"},
            "matrix_path": tmp / "matrix.yaml", "stage_dir": tmp / ".docker-0123",
            "project": {"commit": "a" * 40, "dirty": True}, "gpus": gpus, **kw}
    return container_config("gate-residual-matrix:s-0123", cell_command(cell, ["257"], "r1"),
                            **args)


def test_command_is_the_cell_runner_with_container_paths() -> None:
    argv = cell_command(Cell("s", "plain", "cpu"), ["257", "257-specials"], "r1")
    assert argv == ["python", "-m", "gate_residual_matrix.runner", "cell", "--matrix",
                    CONTAINER_MATRIX,
                    "--stack", "s", "--mode", "plain", "--target", "cpu",
                    "--reports", CONTAINER_REPORTS, "--run-id", "r1",
                    "--case", "257", "--case", "257-specials"]


def test_container_is_locked_down() -> None:
    c = config()
    assert c.create["user"] == f"{IMAGE_UID}:{IMAGE_UID}" != "0:0"
    assert c.create["network_disabled"] is True and c.host["network_mode"] == "none"
    assert c.host["privileged"] is False and c.host["cap_drop"] == ["ALL"]
    assert c.host["security_opt"] == ["no-new-privileges"]
    assert c.host["read_only"] is True  # the root file system, baked-in project included
    assert list(c.host["tmpfs"]) == ["/tmp"]
    # exec (torch.compile loads what it builds there), but no setuid and no device files
    assert {"rw", "exec", "nosuid", "nodev"} <= set(c.host["tmpfs"]["/tmp"].split(","))


def test_only_the_staging_directory_is_writable() -> None:
    binds = config(tmp=Path("/srv/run")).host["binds"]
    assert binds == {"/srv/run/.docker-0123": {"bind": CONTAINER_REPORTS, "mode": "rw"},
                     "/srv/run/matrix.yaml": {"bind": CONTAINER_MATRIX, "mode": "ro"}}
    assert [b for b in binds.values() if b["mode"] != "ro"] == [
        {"bind": CONTAINER_REPORTS, "mode": "rw"}]


def test_environment_carries_the_mode_and_the_checkout() -> None:
    env = config().create["environment"]
    assert env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and env["PYTHONUNBUFFERED"] == "1"
    assert env["GATE_RESIDUAL_COMMIT"] == "a" * 40 and env["GATE_RESIDUAL_DIRTY"] == "1"
    clean = config(project={"commit": None, "dirty": None}).create["environment"]
    assert "GATE_RESIDUAL_COMMIT" not in clean


@pytest.mark.parametrize(("target", "gpus", "expected"), [
    ("cuda", "all", [{"count": -1, "capabilities": [["gpu"]]}]),
    ("cuda", "0,2", [{"device_ids": ["0", "2"], "capabilities": [["gpu"]]}]),
    ("cuda", "GPU-5c1e2a3b-0000-1111-2222-333344445555",
     [{"device_ids": ["GPU-5c1e2a3b-0000-1111-2222-333344445555"], "capabilities": [["gpu"]]}]),
    ("cpu", "all", []),
    ("cpu", "0", []),
])
def test_gpu_request_only_for_cuda(target: str, gpus: str, expected: list) -> None:
    assert config(target=target, gpus=gpus).host["device_requests"] == expected


@pytest.mark.parametrize("gpus", ["", "0;1", "all,0", "$(id)", "0,,1"])
def test_bad_gpu_ids_are_refused(gpus: str) -> None:
    """A usage error (exit 2), not a backend that cannot run (exit 4)."""
    with pytest.raises(ConfigError, match="--gpus: expected"):
        gpu_request(gpus)
    with pytest.raises(ConfigError):
        DockerBackend(gpus=gpus)


# --- the container's life, on a fake engine -------------------------------------------------

class FakeAPI:
    """Records the calls DockerBackend makes; ``wait`` times out when ``hang`` is set."""

    def __init__(self, *, hang: bool = False, start_fails: bool = False,
                 build: list[dict] | None = None, images: set[str] | None = None,
                 on_wait=None, on_create=None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.hang, self.start_fails = hang, start_fails
        self.build_chunks = build or []
        self.present = images if images is not None else set()
        self.on_wait, self.on_create = on_wait, on_create

    def ping(self):
        return True

    def create_host_config(self, **kw):
        self.calls.append(("host_config", kw))
        return kw

    def create_container(self, **kw):
        self.calls.append(("create", kw))
        if self.on_create:
            self.on_create()
        return {"Id": "c1"}

    def start(self, container):
        self.calls.append(("start", container))
        if self.start_fails:
            raise docker_backend.docker_errors.APIError("cannot start")

    def wait(self, container, timeout=None):
        self.calls.append(("wait", timeout))
        if self.on_wait:
            self.on_wait()
        if self.hang and timeout != 60:
            raise requests.exceptions.ReadTimeout("read timed out")
        return {"StatusCode": 137 if self.hang else 0}

    def kill(self, container):
        self.calls.append(("kill", container))

    def inspect_container(self, container):
        return {"State": {"ExitCode": 137 if self.hang else 0, "OOMKilled": False}}

    def logs(self, container, stdout=True, stderr=True):
        return b"line 1\nline 2\n"

    def remove_container(self, container, force=False):
        self.calls.append(("remove", (container, force)))

    def inspect_image(self, ref):
        if ref not in self.present:
            raise docker_backend.docker_errors.ImageNotFound(f"No such image: {ref}")
        return {"Id": "sha256:" + "1" * 64, "RepoDigests": [], "Size": 10}

    def build(self, **kw):
        self.calls.append(("build", {k: v for k, v in kw.items() if k != "fileobj"}))
        yield from self.build_chunks
        if not any("error" in c for c in self.build_chunks):
            self.present.add(kw["tag"])

    def images(self, name=None):
        label = "org.gate-residual-matrix.stack"
        return [{"RepoTags": ["gate-residual-matrix:cpu-torch2.13-" + "a" * 16,
                              "gate-residual-matrix:cpu-torch2.13-" + "b" * 16],
                 "Labels": {label: "cpu-torch2.13"}},
                {"RepoTags": ["gate-residual-matrix:cpu-torch2.13-x-" + "c" * 16],
                 "Labels": {label: "cpu-torch2.13-x"}},
                {"RepoTags": ["gate-residual-matrix:cpu-torch2.13-mine"],
                 "Labels": {label: "cpu-torch2.13"}}]

    def remove_image(self, tag, force=False):
        self.calls.append(("remove_image", tag))

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def backend_on(api: FakeAPI, tmp_path: Path) -> DockerBackend:
    backend = DockerBackend(logs_dir=tmp_path / "logs", progress=False)
    backend._client = api
    return backend


def test_timeout_kills_and_always_removes(tmp_path: Path) -> None:
    api = FakeAPI(hang=True)
    ending = backend_on(api, tmp_path)._run_container(config(), 2.5)
    assert (ending.exit_code, ending.timed_out, ending.oom_killed) == (137, True, False)
    assert "line 2" in ending.log
    assert api.names() == ["host_config", "create", "start", "wait", "kill", "wait", "remove"]
    assert ("wait", 2.5) in api.calls and ("remove", ("c1", True)) in api.calls
    host = dict(api.calls)["host_config"]
    assert dict(host["device_requests"][0])["Count"] == -1  # a docker.types.DeviceRequest


def test_container_is_removed_when_start_fails(tmp_path: Path) -> None:
    api = FakeAPI(start_fails=True)
    with pytest.raises(docker_backend.docker_errors.APIError):
        backend_on(api, tmp_path)._run_container(config(), 10)
    assert api.names()[-1] == "remove"


def spec_of(name: str = "cpu-torch2.13"):
    data = yaml.safe_load(MATRIX.read_text())
    data["pip"] = {}
    data["stacks"][name]["pip"] = {}
    return render(parse_matrix(data), name, matrix_dir=ROOT)


def test_missing_base_image_is_never_pulled(tmp_path: Path) -> None:
    api = FakeAPI(images=set())
    result = backend_on(api, tmp_path).ensure_image(spec_of())
    assert not result.ok and "build" not in api.names()
    assert "gate-residual/base:bookworm-py3.11 is not on this Docker engine and is never " \
           "pulled" in result.reason and "nox -s base_image" in result.reason


def test_failed_build_keeps_the_log_tail_and_is_not_retried(tmp_path: Path) -> None:
    spec = spec_of()
    chunks = [{"stream": "Step 1/20 : FROM gate-residual/base:bookworm-py3.11 AS runtime\n"},
              {"stream": "ERROR: No matching distribution found for torch==2.13.0+cpu\n"},
              {"error": "The command '/bin/sh -c python3.11 -m venv' returned a non-zero code: 1",
               "errorDetail": {"code": 1}}]
    api = FakeAPI(build=chunks, images={spec.base_image})
    backend = backend_on(api, tmp_path)
    result = backend.ensure_image(spec)
    assert not result.ok and "returned a non-zero code: 1" in result.reason
    assert "No matching distribution found" in result.log_tail
    assert result.steps == ["Step 1/20 : FROM gate-residual/base:bookworm-py3.11 AS runtime"]
    assert "No matching distribution" in (tmp_path / "logs" / "cpu-torch2.13.build.log").read_text()
    build_kw = dict(api.calls)["build"]
    assert build_kw["pull"] is False and build_kw["tag"] == spec.tag
    assert build_kw["custom_context"] is True and build_kw["rm"] is True
    assert backend.ensure_image(spec) is result and api.names().count("build") == 1


def test_present_image_is_not_built(tmp_path: Path) -> None:
    spec = spec_of()
    api = FakeAPI(images={spec.tag, spec.base_image})
    result = backend_on(api, tmp_path).ensure_image(spec)
    assert result.ok and result.cached and "build" not in api.names()
    assert result.image_id == "sha256:" + "1" * 64 and result.base_id == result.image_id


# --- which backend runs which cell ------------------------------------------------------

def test_route() -> None:
    assert backends.route("host", "docker") == ("host", None)
    assert backends.route("host", "host") == ("host", None)
    assert backends.route("docker", "docker") == ("docker", None)
    name, why = backends.route("docker", "host")
    assert name is None and "stack kind docker runs only in a container" in why


class NoEngine(DockerBackend):
    def available(self) -> str | None:
        return "no Docker engine answers (test)"


def test_resolve() -> None:
    assert backends.resolve("host", NoEngine()) == ("host", None)
    assert backends.resolve("auto", NoEngine()) == (
        "host", "--backend auto: host, since no Docker engine answers (test)")
    with pytest.raises(BackendError, match=r"^--backend docker: no Docker engine answers"):
        backends.resolve("docker", NoEngine())
    with pytest.raises(ConfigError, match="unknown backend 'podman'; choose from auto, host"):
        backends.resolve("podman")


def test_docker_stacks_are_skipped_with_a_report_on_the_host_backend(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gate_residual_matrix.runner.pipeline import run_matrix

    outcomes = run_matrix(MATRIX, reports_dir=tmp_path, stacks=["cpu-torch2.13",
                                                                "torch2.14-vllm0.33"],
                          modes=["plain"], targets=["cpu"], backend="host", render=False)
    assert [(o.cell, o.status) for o in outcomes] == [
        ("torch2.14-vllm0.33-plain-cpu", "skipped"), ("cpu-torch2.13-plain-cpu", "skipped")]
    report = read_report(tmp_path / "cpu-torch2.13-plain-cpu.json").data
    assert report["status"] == "skipped" and "runs only in a container" in report["reason"]
    assert report["cell"]["backend"] == "host"
    out = capsys.readouterr().out
    # the stacks are named once, not a line per cell
    assert ("[runner] skipped docker stack(s) torch2.14-vllm0.33, cpu-torch2.13: stack kind "
            "docker runs only in a container") in out
    assert "[runner] cell cpu-torch2.13-plain-cpu: skipped" not in out


def test_auto_without_an_engine_says_so_and_skips(tmp_path: Path, monkeypatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from gate_residual_matrix.runner import pipeline as run
    from gate_residual_matrix.runner.backends import local

    monkeypatch.setattr(local, "DockerBackend", NoEngine)
    outcomes = run.run_matrix(MATRIX, reports_dir=tmp_path, stacks=["cpu-torch2.13"],
                              modes=["plain"], targets=["cpu"], backend="auto", render=False)
    assert [o.status for o in outcomes] == ["skipped"]
    assert "[runner] --backend auto: host, since no Docker engine answers (test)" in \
        capsys.readouterr().out
    # the cell's reason says what is missing and how to get it (README: "Two commands")
    assert read_report(outcomes[0].path).data["reason"] == (
        "stack kind docker runs only in a container: --backend auto: host, since no Docker "
        "engine answers (test); start a Docker engine (e.g. bash .ci/install-docker.sh, as "
        "root) and make the base image once (nox -s base_image)")
    assert outcomes[0].reason == run.STACK_SKIPPED  # the summary points at the one line


FETCH_FAILED = ("Error while fetching server API version: ('Connection aborted.', "
                "FileNotFoundError(2, 'No such file or directory'))")


class Unreachable(DockerBackend):
    """docker-py's client made, its ping failing as on a host without an engine."""

    def _api(self):
        from docker import errors

        class API:
            def ping(self):
                raise errors.DockerException(FETCH_FAILED)

        return API()


def test_no_engine_is_one_sentence_not_docker_pys_text() -> None:
    """The skip reason and the error say what to do, never the library's exception text."""
    from gate_residual_matrix.runner.backends.docker.engine import ENGINE_REFUSES, NO_ENGINE

    assert Unreachable().available() == NO_ENGINE == (
        "no Docker engine: start one, or run `nox -s matrix -- --backend host`")
    with pytest.raises(BackendError) as info:
        backends.resolve("docker", Unreachable())
    assert str(info.value) == f"--backend docker: {NO_ENGINE}"

    class Refused(DockerBackend):
        def _api(self):
            from docker import errors
            raise errors.DockerException(
                "Error while fetching server API version: ('Connection aborted.', "
                "PermissionError(13, 'Permission denied'))")

    assert Refused().available() == ENGINE_REFUSES


def test_no_engine_with_backend_docker_is_exit_4_in_one_line(
        tmp_path: Path, monkeypatch, capsys: pytest.CaptureFixture[str]) -> None:
    from gate_residual_matrix.runner.__main__ import main
    from gate_residual_matrix.runner.backends import local

    monkeypatch.setattr(local, "DockerBackend", Unreachable)
    assert main(["matrix", "--reports", str(tmp_path / "r"), "--backend", "docker",
                 "--stack", "cpu-torch2.13", "--target", "cpu", "--mode", "plain"]) == 4
    err = capsys.readouterr().err
    assert err == ("error: --backend docker: no Docker engine: start one, or run "
                   "`nox -s matrix -- --backend host`\n")


def test_prune_removes_only_this_stacks_older_tags(tmp_path: Path) -> None:
    spec = spec_of()
    api = FakeAPI()
    removed = backend_on(api, tmp_path).prune(spec)
    assert removed == ["gate-residual-matrix:cpu-torch2.13-" + "a" * 16,
                       "gate-residual-matrix:cpu-torch2.13-" + "b" * 16]
    assert [c for c in api.calls if c[0] == "remove_image"] == [("remove_image", t)
                                                                 for t in removed]


def test_build_streams_with_a_progress_bar(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    spec = spec_of()
    chunks = [{"stream": f"Step {i}/3 : RUN step {i}\n"} for i in (1, 2, 3)]
    chunks.append({"stream": "Successfully tagged " + spec.tag + "\n"})
    api = FakeAPI(build=chunks, images={spec.base_image})
    backend = DockerBackend(logs_dir=tmp_path / "logs", progress=True)
    backend._client = api
    result = backend.ensure_image(spec)
    assert result.ok and not result.cached and len(result.steps) == 3
    err = capsys.readouterr().err
    assert "build cpu-torch2.13" in err and "3/3" in err and "RUN step 3" in err
    assert "Successfully tagged" in (tmp_path / "logs" / "cpu-torch2.13.build.log").read_text()


# --- --backend auto on a host that cannot make an image ------------------------------------

def _no_base_matrix(tmp_path: Path) -> Path:
    """The CPU stack without host paths (its base image is absent from the fake engine) and
    a copy that names a wheelhouse this host does not have; one small case."""
    data = yaml.safe_load(MATRIX.read_text())
    data.pop("pip", None)
    cpu = {**data["stacks"]["cpu-torch2.13"], "pip": {}}
    data["stacks"] = {"host": {"kind": "host"}, "cpu-torch2.13": cpu,
                      "wheelless": {**cpu, "pip": {"find_links": str(tmp_path / "wheels")}}}
    data.update(cases=[{"n": 1}], targets=["cpu"], modes={"plain": {}},
                timing={"warmup": 1, "iters": 2}, implementations=["eager", "numba", "fp64"])
    data.pop("batch_invariance", None)
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def empty_engine(monkeypatch, tmp_path: Path) -> FakeAPI:
    """An engine answers, with no image at all (a fresh machine with Docker installed)."""

    api = FakeAPI(images=set())

    class EmptyEngine(DockerBackend):
        def __init__(self, **kw):
            super().__init__(logs_dir=tmp_path / "logs", progress=False, **kw)
            self._client = api

    from gate_residual_matrix.runner.backends import local

    monkeypatch.setattr(local, "DockerBackend", EmptyEngine)
    return api


NOBASE = ("base image gate-residual/base:bookworm-py3.11 is not on this Docker engine and is "
          "never pulled: `docker pull gate-residual/base:bookworm-py3.11` where a registry is "
          "reachable, or make one with `nox -s base_image`")


def test_auto_skips_docker_stacks_this_host_cannot_make_and_exits_0(
        tmp_path: Path, empty_engine: FakeAPI, capsys: pytest.CaptureFixture[str]) -> None:
    """The regression: on a fresh machine with an engine but no base image, `nox -s matrix`
    (--backend auto) exited 5 with every docker cell build_error."""
    from gate_residual_matrix.runner.__main__ import main

    reports = tmp_path / "reports"
    code = main(["matrix", "--matrix", str(_no_base_matrix(tmp_path)), "--reports",
                 str(reports), "--stack", "cpu-torch2.13", "--stack", "wheelless"])
    out, err = capsys.readouterr()
    assert code == 0, err
    nobase = read_report(reports / "cpu-torch2.13-plain-cpu.json").data
    assert nobase["status"] == "skipped" and nobase["cell"]["backend"] == "docker"
    assert nobase["reason"].startswith("image gate-residual-matrix:cpu-torch2.13-")
    assert nobase["reason"].endswith(
        " is not built, and the matrix never builds one: `nox -s build -- --stack "
        f"cpu-torch2.13`, or add --build to the matrix command; first, its {NOBASE}")
    wheelless = read_report(reports / "wheelless-plain-cpu.json").data
    assert wheelless["status"] == "skipped"
    assert wheelless["reason"] == (f'stack "wheelless": pip.find_links {tmp_path / "wheels"}: '
                                   "this host has no such wheelhouse (a directory of wheels), "
                                   "which the image build needs (docs/containers.md)")
    assert ("[runner] skipped docker stack(s) cpu-torch2.13: no image, and the matrix never "
            "builds one: `nox -s build -- --stack cpu-torch2.13`, or add --build; first, "
            f"their {NOBASE}") in out.splitlines()
    assert "build" not in empty_engine.names()  # nothing was pulled or built


def _two_cells_matrix(tmp_path: Path) -> Path:
    """The CPU stack (no host paths) and the host stack, two modes: two cells a stack."""
    data = yaml.safe_load(_no_base_matrix(tmp_path).read_text())
    data["stacks"].pop("wheelless")
    data["modes"] = {"plain": {}, "deterministic": {"torch": {"deterministic": True}}}
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def base_only_engine(empty_engine: FakeAPI) -> FakeAPI:
    """An engine with the base image but no stack image: everything a build needs."""
    empty_engine.present.add("gate-residual/base:bookworm-py3.11")
    return empty_engine


def test_matrix_never_builds_a_missing_image_and_names_the_stack_once(
        tmp_path: Path, base_only_engine: FakeAPI, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 11: `nox -s matrix` builds nothing on its own. The stack's two cells are
    skipped; the stack and the command that builds it are named once on the console."""
    from gate_residual_matrix.runner.__main__ import main

    reports = tmp_path / "reports"
    code = main(["matrix", "--matrix", str(_two_cells_matrix(tmp_path)), "--reports",
                 str(reports), "--stack", "cpu-torch2.13"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "build" not in base_only_engine.names() and "create" not in base_only_engine.names()
    command = "`nox -s build -- --stack cpu-torch2.13`, or add --build"
    assert (out + err).count(command) == 1, out
    assert ("[runner] skipped docker stack(s) cpu-torch2.13: no image, and the matrix never "
            f"builds one: {command}") in out.splitlines()
    for mode in ("plain", "deterministic"):
        report = read_report(reports / f"cpu-torch2.13-{mode}-cpu.json").data
        assert report["status"] == "skipped"
        assert "is not built, and the matrix never builds one: `nox -s build -- --stack " \
               "cpu-torch2.13`, or add --build to the matrix command" == \
               report["reason"].split(" ", 2)[2]


def test_build_option_builds_the_missing_image_first(
        tmp_path: Path, base_only_engine: FakeAPI, capsys: pytest.CaptureFixture[str]) -> None:
    """`--build`: the image is built once, before the first container, and then used."""
    from gate_residual_matrix.runner.__main__ import main

    reports = tmp_path / "reports"
    main(["matrix", "--matrix", str(_two_cells_matrix(tmp_path)), "--reports", str(reports),
          "--stack", "cpu-torch2.13", "--build"])
    names = base_only_engine.names()
    assert names.count("build") == 1 and names.index("build") < names.index("create")
    assert names.count("create") == 2  # both cells ran in the image just built
    assert "skipped docker stack" not in capsys.readouterr().out


def test_explicit_docker_backend_without_an_image_stops_before_anything_runs(
        tmp_path: Path, base_only_engine: FakeAPI, capsys: pytest.CaptureFixture[str]) -> None:
    """`--backend docker` asks for containers: a missing image is exit 4 (a backend cannot
    run), nothing run or written, with the command that builds it; not a silent skip."""
    from gate_residual_matrix.runner.__main__ import main

    reports = tmp_path / "reports"
    code = main(["matrix", "--matrix", str(_two_cells_matrix(tmp_path)), "--reports",
                 str(reports), "--backend", "docker"])
    err = capsys.readouterr().err
    assert code == 4
    assert err.splitlines() == [
        "error: --backend docker: no image for docker stack(s) cpu-torch2.13 (the matrix never "
        "builds one): `nox -s build -- --stack cpu-torch2.13`, or add --build"]
    assert not reports.exists() and "build" not in base_only_engine.names()


def test_explicit_docker_backend_with_build_reports_a_missing_base_as_build_error(
        tmp_path: Path, empty_engine: FakeAPI, capsys: pytest.CaptureFixture[str]) -> None:
    from gate_residual_matrix.runner.__main__ import main

    reports = tmp_path / "reports"
    code = main(["matrix", "--matrix", str(_no_base_matrix(tmp_path)), "--reports",
                 str(reports), "--stack", "cpu-torch2.13", "--stack", "wheelless",
                 "--backend", "docker", "--build"])
    err = capsys.readouterr().err
    assert code == 5
    assert err.splitlines()[-1] == ("error: 2 of 2 cells did not end ok: "
                                    "cpu-torch2.13-plain-cpu (build_error), "
                                    "wheelless-plain-cpu (build_error)")
    nobase = read_report(reports / "cpu-torch2.13-plain-cpu.json").data
    assert "make one with `nox -s base_image`" in nobase["reason"]
    assert "build" not in empty_engine.names()  # never pulled, nothing to build from


def test_a_backend_that_may_not_build_never_builds(tmp_path: Path) -> None:
    """The backend's own guard: a cell that reaches run() without its image ends
    build_error with the build command, and nothing is built."""
    m = _cell_matrix()
    spec = render(m, "cpu-torch2.13", matrix_dir=ROOT)
    api = FakeAPI(images={spec.base_image})
    report = backend_on(api, tmp_path).run(m, Cell("cpu-torch2.13", "plain", "cpu"),
                                           m.cases[:1], matrix_path=MATRIX, reports_dir=tmp_path,
                                           run_id="ab" * 16, timeout_s=60)
    assert report["status"] == "build_error" and "nox -s build -- --stack cpu-torch2.13" in \
        report["reason"]
    assert "build" not in api.names() and "create" not in api.names()


def test_auto_keeps_a_report_of_a_stack_it_cannot_make(tmp_path: Path,
                                                       empty_engine: FakeAPI) -> None:
    """A report made where the image could be built is not replaced by 'skipped'."""
    from gate_residual_matrix.runner.pipeline import run_matrix
    from gate_residual_matrix.runner.reports.store import write_report

    data = read_report(ROOT / "tests" / "data" / "reports" / "host-plain-cuda.json").data
    data["cell"] = {"id": "cpu-torch2.13-plain-cpu", "stack": "cpu-torch2.13", "mode": "plain",
                    "target": "cpu", "backend": "docker"}
    write_report(data, tmp_path / "r")
    before = (tmp_path / "r" / "cpu-torch2.13-plain-cpu.json").read_bytes()
    again = run_matrix(_no_base_matrix(tmp_path), reports_dir=tmp_path / "r",
                       stacks=["cpu-torch2.13"], backend="auto", render=False)
    assert [o.status for o in again] == ["skipped"]
    assert "kept the existing ok report" in again[0].reason
    assert (tmp_path / "r" / "cpu-torch2.13-plain-cpu.json").read_bytes() == before


# --- SIGTERM / Ctrl-C while a container runs ----------------------------------------------

def _cell_matrix():
    data = yaml.safe_load(MATRIX.read_text())
    data.pop("pip", None)
    data["stacks"]["cpu-torch2.13"]["pip"] = {}
    return parse_matrix(data)


def test_sigterm_while_the_container_runs_removes_it_and_the_staging_directory(
        tmp_path: Path) -> None:
    m = _cell_matrix()
    spec = render(m, "cpu-torch2.13", matrix_dir=ROOT)

    def terminated():
        assert list(tmp_path.glob(".docker-*")), "the staging directory exists while it runs"
        raise Interrupted(signal.SIGTERM)

    api = FakeAPI(images={spec.tag, spec.base_image}, on_wait=terminated)
    with pytest.raises(Interrupted) as stopped:
        backend_on(api, tmp_path).run(m, Cell("cpu-torch2.13", "plain", "cpu"), m.cases[:1],
                                      matrix_path=MATRIX, reports_dir=tmp_path, run_id="ab" * 16,
                                      timeout_s=60)
    assert stopped.value.exit_code == 143
    assert api.names()[-1] == "remove" and ("remove", ("c1", True)) in api.calls
    assert not list(tmp_path.glob(".*"))  # no staging directory left


def test_a_signal_during_the_create_lands_once_the_container_is_known(tmp_path: Path) -> None:
    """SIGTERM sent while the engine creates the container: held until the id is in hand,
    then raised, and the container is removed."""
    from gate_residual_matrix.runner.backends.interrupts import signals_interrupt

    def signal_now():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler ran here: held, not raised

    api = FakeAPI(on_create=signal_now)
    with signals_interrupt(), pytest.raises(Interrupted):
        backend_on(api, tmp_path)._run_container(config(), 10)
    assert api.names() == ["host_config", "create", "remove"]
