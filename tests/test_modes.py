"""Modes in fresh processes (runner/cell/modes.py, runner/plan/abba.py): the mode's environment is
in
the cell process before torch is imported, torch settings are applied and recorded, and an
A-B-B-A run records determinism across processes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from gate_residual_matrix.runner.cell import modes
from gate_residual_matrix.runner.config.matrix import TorchSettings
from gate_residual_matrix.runner.errors import ConfigError
from gate_residual_matrix.runner.pipeline import run_matrix
from gate_residual_matrix.runner.plan.abba import across

PINNED_PROJECT = {"GATE_RESIDUAL_COMMIT": "0123456789abcdef0123456789abcdef01234567"}
MATRIX = {
    "schema_version": 1, "op": "gate_residual",
    "problem": {"D": 64, "G": 3, "dtype": "bfloat16", "index_dtype": "int64", "seed": 5},
    "cases": [{"n": 5}], "implementations": ["eager", "fp64"], "baseline": "eager",
    "accuracy_reference": "fp64", "repeats": 1, "timing": {"warmup": 0, "iters": 1},
    "modes": {"plain": {}, "probe": {"env": {"GATE_RESIDUAL_PROBE": "set-by-mode"},
                                     "torch": {"deterministic": True, "tf32": False}}},
    "stacks": {"host": {"kind": "host"}}, "targets": ["cpu"],
}


def test_apply_torch_settings_records_what_it_set(monkeypatch):
    import torch

    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda flag: None)
    got = modes.apply_torch_settings(TorchSettings(deterministic=True, inference_mode=True))
    assert got == {"torch.use_deterministic_algorithms": True, "torch.inference_mode": True}


def test_abba_runs_modes_in_fresh_processes(tmp_path, monkeypatch):
    for k, v in PINNED_PROJECT.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("GATE_RESIDUAL_PROBE", raising=False)
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(MATRIX))
    outcomes = run_matrix(path, reports_dir=tmp_path / "r", backend="host", abba="probe",
                          render=False, timeout_s=300)
    assert [(o.cell, o.status) for o in outcomes] == [("host-plain-cpu", "ok"),
                                                      ("host-probe-cpu", "ok")]
    a = json.loads((tmp_path / "r" / "host-plain-cpu.json").read_text())
    b = json.loads((tmp_path / "r" / "host-probe-cpu.json").read_text())
    assert b["environment"]["mode_environment"] == {"probe": {
        "GATE_RESIDUAL_PROBE": "set-by-mode", "torch.use_deterministic_algorithms": True,
        "torch.backends.cuda.matmul.allow_tf32": False,
        "torch.backends.cudnn.allow_tf32": False}}
    assert b["environment"]["mode_applied_before_torch_import"] is True
    assert a["environment"]["mode_environment"] == {"plain": {}}
    assert "GATE_RESIDUAL_PROBE" not in os.environ  # set in the child only
    order = ["host-plain-cpu", "host-probe-cpu", "host-probe-cpu", "host-plain-cpu"]
    for report in (a, b):
        assert report["environment"]["abba"]["order"] == order
        assert len(set(report["environment"]["abba"]["run_ids"])) == 4
        for entry in report["results"].values():
            assert entry["repeatable_across_processes"] == {
                "5": {"out": True, "res": True, "y": True, "gate": True}}
    assert not [p for p in (tmp_path / "r").iterdir() if p.name.startswith(".abba-")]


def test_abba_mode_must_exist(tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(MATRIX))
    with pytest.raises(ConfigError, match="--abba: expected one of the modes"):
        run_matrix(path, reports_dir=tmp_path / "r", backend="host", abba="nope")


def test_across_compares_sha256_per_tensor():
    one = {"results": {"e": {"sha256": {"5": {"out": "a", "gate": "b"}}}}}
    two = {"results": {"e": {"sha256": {"5": {"out": "a", "gate": "c"}}}}}
    assert across(one, two) == {"e": {"5": {"out": True, "gate": False}}}
    assert across(one, {"results": {}}) == {"e": {"5": {"out": None, "gate": None}}}


def test_matrix_declares_the_issue_modes():
    from gate_residual_matrix.runner.cell import catalog as implementations
    from gate_residual_matrix.runner.config.matrix import load_matrix

    root = Path(__file__).resolve().parent.parent
    m = load_matrix(root / "matrix.yaml", known_implementations=implementations.known)
    assert list(m.modes) == ["plain", "deterministic", "tf32", "inference",
                             "vllm_batch_invariant", "sglang_ieee"]
    assert dict(m.modes["deterministic"].env) == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    assert m.modes["deterministic"].torch.deterministic is True
    assert not (root / "matrix-modes.yaml").exists()  # one matrix: the modes live in it


def test_abba_partner_must_have_cells_on_the_target(tmp_path):
    """A partner mode restricted to cuda cannot pair with cpu cells: refused before any run."""
    matrix = {**MATRIX, "modes": {**MATRIX["modes"], "gpu_only": {"targets": ["cuda"]}},
              "targets": ["cuda", "cpu"]}
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(matrix))
    with pytest.raises(ConfigError, match="mode gpu_only has no cells on target cpu"):
        run_matrix(path, reports_dir=tmp_path / "r", backend="host", abba="gpu_only",
                   targets=["cpu"])
    assert not (tmp_path / "r").exists()


def test_a_case_selection_that_runs_nowhere_is_refused(tmp_path):
    """--case naming only cases of other targets: exit-2 error, nothing built or written."""
    matrix = {**MATRIX, "cases": [{"n": 5}, {"n": 7, "targets": ["cuda"]}],
              "targets": ["cuda", "cpu"]}
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(matrix))
    with pytest.raises(ConfigError, match="no selected case runs on target cpu"):
        run_matrix(path, reports_dir=tmp_path / "r", backend="host", cases=["7"],
                   targets=["cpu"])
    assert not (tmp_path / "r").exists()
