"""runner/gpu_host/footprint.py: a cell's GPU memory estimate, from its cases and shards."""

from __future__ import annotations

from pathlib import Path

from gate_residual_matrix.runner.backends import shards
from gate_residual_matrix.runner.cell import catalog
from gate_residual_matrix.runner.config.matrix import load_matrix
from gate_residual_matrix.runner.gpu_host import footprint
from gate_residual_matrix.runner.plan.cells import cases_on

ROOT = Path(__file__).resolve().parents[1]


def _matrix(name: str):
    return load_matrix(ROOT / name, known_implementations=catalog.known)


def test_case_bytes_count_every_input_in_its_dtype():
    m = _matrix("matrix.yaml")
    by_id = {c.id: c for c in m.cases}
    d, g = m.problem.sizes["D"], m.problem.sizes["G"]
    # residual, y and the upstream gradient (N x D), gate (G x D), index (N)
    n = 32768
    assert footprint.case_bytes(m, by_id["32768"]) == 3 * n * d * 2 + g * d * 2 + n * 8
    assert footprint.case_bytes(m, by_id["32768-float32-int32"]) == \
        3 * n * d * 4 + g * d * 4 + n * 4


def test_a_cell_is_its_shards_base_and_largest_cases():
    m = _matrix("matrix-rms-norm.yaml")
    cases = cases_on(m.cases, "cuda")
    parts = shards.split(m, cases, 3)
    want = sum(footprint.SHARD_BASE_MIB
               + footprint.COPIES * max(footprint.case_bytes(m, c) for c in p) // 2**20
               for p in parts)
    assert footprint.cell_mib(m, cases, 3) == want
    assert footprint.cell_mib(m, cases, 1) < want  # one process: one base, one largest case
    assert footprint.cell_mib(m, [], 3) == 0


def test_two_large_cells_never_fit_together_on_an_h200_but_a_norm_fits_beside_one():
    """The figures as the queue uses them, against an H200's 143,771 MiB."""
    room = int(143771 * footprint.USABLE)

    def cell(name):
        m = _matrix(name)
        cases = cases_on(m.cases, "cuda")
        return footprint.cell_mib(m, cases, shards.count(m, cases, "cuda", 16))

    large = cell("matrix.yaml")
    assert 2 * large > room
    assert large + cell("matrix-rms-norm.yaml") <= room
    assert cell("matrix-scale-shift.yaml") + cell("matrix-add-rms-norm.yaml") <= room


def test_the_capacity_is_the_smallest_gpu_less_a_margin(tmp_path, monkeypatch):
    """A fake nvidia-smi with two GPUs of 143771 and 81559 MiB; none, or a bad answer: None."""
    tool = tmp_path / "nvidia-smi"
    tool.write_text('#!/bin/sh\ncase "$1" in --query-gpu=memory.total) printf "143771\\n81559\\n";;'
                    ' *) echo nope;; esac\n')
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert footprint.capacity_mib() == int(81559 * footprint.USABLE)
    tool.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed'\n")
    assert footprint.capacity_mib() is None
    monkeypatch.setenv("PATH", "/nonexistent")
    assert footprint.capacity_mib() is None
