"""``matrix --expect BASELINE_DIR``: run, then compare, and exit with compare's code.

A real tiny CPU cell (D = 8, G = 2, N = 1 and 5; eager, numba, fp64) is the baseline; a
one-case run (``--case 5``) passes against it, and fails against a copy edited so that one
verdict differs, naming that verdict. The run's reports go elsewhere when ``--reports`` is the
baseline itself, which stays as it was. About 20 s (two cell processes).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from gate_residual_matrix.runner.__main__ import main
from gate_residual_matrix.runner.compare_reports import command

TINY = {
    "schema_version": 1, "op": "gate_residual",
    "problem": {"D": 8, "G": 2, "dtype": "bfloat16", "index_dtype": "int64", "seed": 1},
    "cases": [{"n": 1}, {"n": 5}], "implementations": ["eager", "numba", "fp64"],
    "baseline": "eager", "accuracy_reference": "fp64", "modes": {"plain": {}},
    "stacks": {"host": {"kind": "host"}}, "targets": ["cpu"],
}


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, object]:
    """The baseline (both cases), then ``--expect`` it with ``--reports`` the baseline
    itself: the one-case run goes to the (redirected) expect directory."""
    root = tmp_path_factory.mktemp("expect")
    matrix = root / "matrix.yaml"
    matrix.write_text(yaml.safe_dump(TINY, sort_keys=False))
    common = ["--matrix", str(matrix), "--backend", "host"]
    assert main(["matrix", *common, "--reports", str(root / "base")]) == 0
    before = snapshot(root / "base")
    (root / "new").mkdir()
    (root / "new" / "left-over.json").write_text("{}")  # an earlier run's: emptied first
    saved, command.EXPECT_REPORTS = command.EXPECT_REPORTS, root / "new"
    try:
        code = main(["matrix", *common, "--reports", str(root / "base"), "--expect",
                     str(root / "base"), "--case", "5", "--compare-out", str(root / "out")])
    finally:
        command.EXPECT_REPORTS = saved
    return {"root": root, "common": common, "code": code, "before": before}


def test_a_run_passes_against_itself_and_leaves_the_baseline(runs) -> None:
    root = runs["root"]
    assert runs["code"] == 0
    assert snapshot(root / "base") == runs["before"]
    new = json.loads((root / "new" / "host-plain-cpu.json").read_text())
    assert new["cases"] == [5] and new["status"] == "ok"
    assert not (root / "new" / "left-over.json").exists()
    doc = json.loads((root / "out" / "compare.json").read_text())
    assert (doc["exit_code"], doc["changes"]) == (0, [])
    assert doc["compared"]["host-plain-cpu"] >= 16  # 4 tensors: bits, 2 errors, 2 repeats
    assert doc["notes"]["host-plain-cpu"] == ["1 of 2 baseline cases not in the new report"]


def test_a_baseline_edited_to_differ_fails_naming_the_verdict(runs, tmp_path, capsys) -> None:
    """The baseline says numba's grad_gate equals eager's in case 5; the run's does not."""
    root = runs["root"]
    new = json.loads((root / "new" / "host-plain-cpu.json").read_text())
    gate = new["results"]["numba"]["vs eager"]["5"]["grads"]["gate"]
    assert gate["differ"] > 0  # our fixed-order float32 sum against eager's bf16 adds
    edited = tmp_path / "edited"
    shutil.copytree(root / "base", edited)
    path = edited / "host-plain-cpu.json"
    data = json.loads(path.read_text())
    equal = {**gate, "equal": True, "differ": 0, "max_abs": 0.0, "max_ulp": 0,
             "nan_differ": 0, "nan_payload_differ": 0, "first_differ": None}
    data["results"]["numba"]["vs eager"]["5"]["grads"]["gate"] = dict(equal)
    data["results"]["eager"]["vs numba"]["5"]["grads"]["gate"] = dict(equal)
    path.write_text(json.dumps(data))
    capsys.readouterr()
    code = main(["matrix", *runs["common"], "--reports", str(root / "new"), "--expect",
                 str(edited), "--case", "5", "--compare-out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code == 6, err
    assert "1 cell: 1 ok (1 reused)" in out, out  # the report is current: reused
    assert err.startswith("error: 1 verdict(s) regressed against ") and err.count("\n") == 1
    assert (f"host-plain-cpu: numba vs eager grad_gate: bits:equal->differ (equal → "
            f"{gate['differ']}/{gate['numel']} differ; cases 5)") in err, err
    md = " ".join((tmp_path / "out" / "compare.md").read_text().split(" "))
    row = [" ".join(c.split()) for c in md.split("\n") if c.startswith("| REGRESSED")]
    assert row == [f"| REGRESSED | host-plain-cpu | numba vs eager | grad_gate | "
                   f"`bits:equal->differ` | equal → {gate['differ']}/{gate['numel']} differ | 5 |"]


def test_a_bad_baseline_is_exit_2_before_anything_runs(runs, tmp_path, capsys) -> None:
    code = main(["matrix", *runs["common"], "--reports", str(tmp_path / "new"), "--expect",
                 str(tmp_path / "missing")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --expect: expected a directory of reports")
    assert not (tmp_path / "new").exists()
    code = main(["matrix", *runs["common"], "--reports", str(tmp_path / "new"), "--expect",
                 str(runs["root"] / "base"), "--fail", "bits:nope"])
    assert code == 2 and "unknown rule 'bits:nope'" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
