"""One interface and one failure classifier for every backend (runner/backends/base.py,
runner/backends/failure.py). The host backend's wording of each ending is also checked in
test_faults.py, with real cell processes."""

from __future__ import annotations

import inspect
import signal

import pytest

from gate_residual_matrix.runner.backends.base import Backend, cell_argv, skipped_lines
from gate_residual_matrix.runner.backends.docker.container import (
    CONTAINER_MATRIX,
    CONTAINER_REPORTS,
    cell_command,
)
from gate_residual_matrix.runner.backends.failure import (
    LOG_TAIL_CHARS,
    Ending,
    classify,
    explain,
    log_tail,
)
from gate_residual_matrix.runner.backends.host import HostBackend
from gate_residual_matrix.runner.backends.registry import BACKENDS
from gate_residual_matrix.runner.plan.cells import Cell
from gate_residual_matrix.runner.status import Status

OOM_LOG = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


@pytest.mark.parametrize(("ending", "status"), [
    (Ending(-9, timed_out=True, oom_killed=True), Status.TIMEOUT),  # the timeout decides
    (Ending(137, oom_killed=True), Status.OOM),  # docker's State.OOMKilled, Ray's monitor
    (Ending(1, OOM_LOG), Status.OOM),
    (Ending(1, "MemoryError"), Status.ERROR),
    (Ending(-signal.SIGKILL, oom_kills=(3, 4)), Status.OOM),
    (Ending(-signal.SIGKILL, oom_kills=(3, 3)), Status.ERROR),
    (Ending(-signal.SIGKILL), Status.ERROR),  # ambiguous without /proc/vmstat
    (Ending(137, oom_kills=(3, 4)), Status.ERROR),  # a container's 137 is no signal number
    (Ending(None), Status.ERROR),
])
def test_one_rule_classifies_every_backends_ending(ending: Ending, status: Status) -> None:
    assert classify(ending) is status


@pytest.mark.parametrize(("ending", "reason"), [
    (Ending(137, timed_out=True), "timed out: no report after the cell timeout of 60 s; the "
                                  "container was killed"),
    (Ending(137, oom_killed=True), "out of memory: the container was OOM-killed (exit code "
                                   "137) and wrote no report"),
    (Ending(1, OOM_LOG), "out of memory: the container was OOM-killed (exit code 1) and wrote "
                         "no report"),
    (Ending(3), "container exited with code 3 and wrote no report"),
])
def test_a_container_ending_in_the_docker_backends_words(ending: Ending, reason: str) -> None:
    assert explain(ending, 60.0, "container") == reason


def test_a_process_ending_in_the_host_backends_words() -> None:
    assert explain(Ending(-9, timed_out=True), 2.5) == (
        "timed out: no report after the cell timeout of 2.5 s; the cell's process group was "
        "killed")
    assert explain(Ending(-signal.SIGSEGV), 60.0) == (
        "cell process was killed by SIGSEGV (exit code -11) and wrote no report")
    assert explain(Ending(-200), 60.0).startswith("cell process was killed by signal 200")


def test_log_tail_keeps_the_end() -> None:
    assert log_tail("short") == "short"
    long = "x" * LOG_TAIL_CHARS + "END"
    assert log_tail(long) == "…" + long[-LOG_TAIL_CHARS:] and log_tail(long).endswith("END")


def test_host_and_container_run_the_same_cell_argv() -> None:
    cell = Cell("s", "plain", "cpu")
    host = HostBackend().command(matrix_path="m.yaml", cell=cell, case_ids=["1", "257"],
                                 reports_dir="/r", run_id="ab")
    container = cell_command(cell, ["1", "257"], "ab")
    assert host[1:] == cell_argv("-", "m.yaml", "/r", cell, ["1", "257"], "ab")[1:]
    swap = {"m.yaml": CONTAINER_MATRIX, "/r": CONTAINER_REPORTS}
    assert container == ["python", *(swap.get(a, a) for a in host[1:])]


def test_every_backend_has_the_interface() -> None:
    wanted = {name: inspect.signature(getattr(Backend, name))
              for name in ("available", "prepare", "fingerprint_extra", "run")}
    for name, made in BACKENDS.items():
        backend = made()
        assert backend.name == name
        for method, signature in wanted.items():
            have = inspect.signature(getattr(type(backend), method))
            assert list(have.parameters) == list(signature.parameters), (name, method)


def test_the_host_prepares_nothing_and_skipped_stacks_share_a_line() -> None:
    assert HostBackend().prepare(None, ["host"], strict=True) == {}  # type: ignore[arg-type]
    assert skipped_lines({"a": "why", "b": "other", "c": "why"}) == [
        "skipped docker stack(s) a, c: why", "skipped docker stack(s) b: other"]
