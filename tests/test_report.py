"""Tests for runner.reports.store: schema validation, atomic writes, reading good and bad files."""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gate_residual_matrix.runner.errors import ReportError
from gate_residual_matrix.runner.reports import store as report_mod
from gate_residual_matrix.runner.reports.store import (
    SCHEMA_PATH,
    SCHEMA_VERSION,
    LoadedReport,
    iter_pairs,
    read_report,
    read_reports,
    upgrade,
    validate,
    write_report,
)
from tests.committed_reports import REFERENCE

DATA = Path(__file__).parent / "data" / "reports"
SHARED_REFERENCE = (
    Path(__file__).parent.parent.parent / "shared" / "reference-reports" / "gate_residual_b200.json"
)


def load(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


@pytest.fixture
def good() -> dict[str, Any]:
    """A synthetic report as this runner writes it (the data file is version 1: upgraded)."""
    return upgrade(load("host-plain-cuda.json"))


# --------------------------------------------------------------------------- schema


def test_schema_is_valid_draft_2020_12() -> None:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["schema_version"] == {"const": SCHEMA_VERSION}


@pytest.mark.parametrize(
    "name",
    [
        "host-plain-cuda.json",
        "host-compile-cpu.json",
        "docker-vllm-plain-cuda.json",
        "docker-sglang-plain-cuda.json",
    ],
)
def test_validate_accepts_synthetic_reports(name: str) -> None:
    validate(load(name))


def test_validate_accepts_minimal_error_report() -> None:
    validate(
        {
            "schema_version": 1,
            "kind": "gate_residual_matrix",
            "op": "gate_residual",
            "cell": {"id": "host-plain-cuda", "stack": "host", "mode": "plain",
                     "target": "cuda"},
            "status": "error",
            "environment": {},
            "cases": [],
            "results": {},
        }
    )


def _set(doc: dict[str, Any], path: list[Any], value: Any) -> None:
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


CMP = ["results", "numba", "vs eager", "257", "grads", "gate"]


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (["status"], "crashed", "status: 'crashed' is not one of"),
        (["schema_version"], 3, "schema_version: 2 was expected"),
        (["unknown_top_level"], 1, "Additional properties are not allowed"),
        (["cell", "id"], "../evil", "cell.id"),
        ([*CMP, "max_abs"], float("nan"), '["vs eager"]["257"].grads.gate.max_abs: non-finite'),
        ([*CMP, "max_abs"], float("inf"), 'encode infinity as "inf"'),
        ([*CMP, "max_abs"], "Infinity", "grads.gate.max_abs"),
        ([*CMP, "max_abs"], -1.0, "grads.gate.max_abs"),
        ([*CMP, "max_ulp"], 1.5, "grads.gate.max_ulp"),
        ([*CMP, "differ"], 3, "equal is True but differ is 3"),
        ([*CMP, "differ"], 10**9, "differ"),
        ([*CMP, "extra"], 1, "Additional properties are not allowed"),
        (["results", "numba", "vs eager", "4097"], {"out": []}, "4097"),
        (["results", "numba", "status"], "maybe", "results.numba.status"),
        (["problem", "dtype"], "float8", "problem.dtype"),
        (["cases"], [1, 257, 0], "cases[2]"),
        (["environment", "capability"], (9, 0), "environment.capability"),
    ],
)
def test_validate_rejects(good: dict[str, Any], path: list[Any], value: Any, expected: str) -> None:
    _set(good, path, value)
    with pytest.raises(ReportError) as info:
        validate(good)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message and message.startswith("invalid report: ")


@pytest.mark.parametrize(
    "key", ["schema_version", "kind", "op", "cell", "status", "environment", "cases", "results"]
)
def test_validate_rejects_missing_required_key(good: dict[str, Any], key: str) -> None:
    del good[key]
    with pytest.raises(ReportError, match=f"'{key}' is a required property"):
        validate(good)


def test_ok_report_needs_results_and_inputs(good: dict[str, Any]) -> None:
    ok_empty = copy.deepcopy(good)
    ok_empty["results"] = {}
    with pytest.raises(ReportError, match="results"):
        validate(ok_empty)
    del good["inputs"]
    with pytest.raises(ReportError, match="'inputs' is a required property"):
        validate(good)


def test_validate_rejects_case_keys_not_in_cases(good: dict[str, Any]) -> None:
    good["cases"] = [1]
    with pytest.raises(ReportError, match='case "257" is not listed in cases'):
        validate(good)


def test_max_abs_inf_string_and_open_environment_accepted(good: dict[str, Any]) -> None:
    for impl, other in (("numba", "eager"), ("eager", "numba")):  # both directions agree
        cmp = good["results"][impl][f"vs {other}"]["257"]["grads"]["gate"]
        cmp.update(equal=False, differ=1, max_abs="inf")  # an unequal CMP: "inf" is its max
    good["environment"]["new_probe"] = {"anything": [1, 2]}
    good["results"]["numba"]["new_field"] = "forward compatible"
    validate(good)


# --------------------------------------------------------------------------- writing


def test_write_report_round_trips(tmp_path: Path) -> None:
    good = load("host-plain-cuda.json")
    path = write_report(good, tmp_path / "reports")  # a version-1 report: written upgraded
    assert path == tmp_path / "reports" / "host-plain-cuda.json"
    text = path.read_text(encoding="utf-8")
    assert text.endswith("}\n") and text.startswith('{\n  "schema_version": 2,')
    current = upgrade(good)
    assert json.loads(text) == current
    assert list(json.loads(text)) == list(current)  # key order kept (sort_keys=False)
    assert sorted(p.name for p in path.parent.iterdir()) == ["host-plain-cuda.json"]
    loaded = read_report(path)
    assert loaded == LoadedReport(path, current, "ours", None)
    assert write_report(current, tmp_path / "again").read_text(encoding="utf-8") == text


def test_write_report_invalid_writes_nothing_and_keeps_existing(
    tmp_path: Path, good: dict[str, Any]
) -> None:
    path = write_report(good, tmp_path)
    before = path.read_bytes()
    bad = copy.deepcopy(good)
    _set(bad, [*CMP, "max_abs"], float("nan"))
    with pytest.raises(ReportError, match="non-finite"):
        write_report(bad, tmp_path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize("cell_id", ["../escape", ".hidden", "a/b", "", "with space", None])
def test_write_report_rejects_bad_cell_ids(
    tmp_path: Path, good: dict[str, Any], cell_id: Any
) -> None:
    good["cell"]["id"] = cell_id
    with pytest.raises(ReportError, match=r"cell\.id"):
        write_report(good, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_write_report_failed_replace_leaves_no_temp_file(
    tmp_path: Path, good: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_report(good, tmp_path)
    before = path.read_bytes()

    def boom(src: Any, dst: Any) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(report_mod.os, "replace", boom)
    changed = copy.deepcopy(good)
    changed["duration_s"] = 99.0
    with pytest.raises(OSError, match="disk on fire"):
        write_report(changed, tmp_path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_write_report_fsyncs_file_and_directory(
    tmp_path: Path, good: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(report_mod.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    write_report(good, tmp_path)
    assert len(synced) == 2


# --------------------------------------------------------------------------- reading


def test_read_reports_flags_bad_files_and_keeps_going() -> None:
    loaded = {r.path.name: r for r in read_reports(DATA)}
    assert "timing.json" not in loaded  # under bench/
    assert [r.path for r in read_reports(DATA)] == sorted(r.path for r in loaded.values())
    for name in [
        "host-plain-cuda.json",
        "host-compile-cpu.json",
        "docker-vllm-plain-cuda.json",
        "docker-sglang-plain-cuda.json",
    ]:
        assert loaded[name].problem is None and loaded[name].origin == "ours", name
        assert loaded[name].data is not None
    expected = {
        "corrupt.json": "corrupt JSON: Expecting value at line 1",
        "truncated.json": "truncated JSON",
        "newer.json": "schema_version 3 is newer than this runner reads (2): refused",
        "invalid-status.json": "status: 'crashed' is not one of",
    }
    for name, problem in expected.items():
        assert loaded[name].data is None, name
        assert loaded[name].problem is not None and problem in loaded[name].problem, name
        assert loaded[name].path == DATA / name


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "truncated: the file is empty"),
        (b'{"schema_version": 1, "kind": "x", "cases": [1, 2', "truncated JSON"),
        (b'{"reason": "unterminated', "truncated JSON: Unterminated string"),
        (b'{"a": 1} trailing', "corrupt JSON: Extra data"),
        (b"\xff\xfe{}", "corrupt: not UTF-8"),
        (b"[1, 2]", "not a report: the JSON is a list"),
        (b'{"kind": "something else"}', "not a report: no schema_version"),
        (b'{"schema_version": "1"}', "schema_version: expected an integer"),
        (b'{"schema_version": 0}', "schema_version 0 is unknown"),
    ],
)
def test_read_report_problems(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(content)
    loaded = read_report(path)
    assert loaded.data is None and not loaded.ok
    assert loaded.problem is not None and loaded.problem.startswith(problem)


def test_read_reports_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="not found"):
        read_reports(tmp_path / "nope")


def test_upgrade_identity_and_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    assert upgrade(current := {"schema_version": 2, "x": 1}) is current
    doc = {"schema_version": 1, "x": 1}
    monkeypatch.setattr(report_mod, "SCHEMA_VERSION", 3)
    monkeypatch.setattr(
        report_mod,
        "UPGRADES",
        {
            1: lambda d: {**d, "schema_version": 2, "y": 2},
            2: lambda d: {**d, "schema_version": 3, "z": 3},
        },
    )
    assert report_mod.upgrade(doc) == {"schema_version": 3, "x": 1, "y": 2, "z": 3}
    with pytest.raises(ReportError, match="newer"):
        report_mod.upgrade({"schema_version": 4})


# --------------------------------------------------------------------------- foreign


def test_reference_copy_is_byte_identical() -> None:
    if not SHARED_REFERENCE.exists():
        pytest.skip("shared reference report not present")
    assert REFERENCE.read_bytes() == SHARED_REFERENCE.read_bytes()


def test_reference_report_is_read_as_foreign() -> None:
    loaded = read_report(REFERENCE)
    assert loaded.origin == "foreign" and loaded.problem is None
    assert loaded.data is not None and "schema_version" not in loaded.data


def test_reference_iter_pairs_figures() -> None:
    data = read_report(REFERENCE).data
    assert data is not None
    rows = list(iter_pairs(data))
    # 2 directions x 4 cases, in the order of "cases" (the file lists 32768 before 4097).
    assert [(r.impl, r.other, r.case_id) for r in rows] == [
        (a, b, c)
        for a, b in [("diffusers", "rl_kernel"), ("rl_kernel", "diffusers")]
        for c in ["1", "257", "4097", "32768"]
    ]
    for row in rows:
        assert list(row.tensors) == ["out", "res", "y", "gate"]
        for name in ["out", "res", "y"]:
            assert row.tensors[name]["equal"] is True
    gate = {(r.impl, r.case_id): r.tensors["gate"] for r in rows}
    expected = {"1": (0, 0.0), "257": (35402, 0.375), "4097": (44538, 4.5), "32768": (46978, 32.0)}
    for impl in ["diffusers", "rl_kernel"]:
        for case, (differ, max_abs) in expected.items():
            cmp = gate[(impl, case)]
            assert (cmp["differ"], cmp["numel"], cmp["max_abs"]) == (differ, 48384, max_abs)
            assert cmp["equal"] is (differ == 0)
    out_32768 = next(r for r in rows if r.case_id == "32768").tensors["out"]
    assert out_32768["numel"] == 32768 * 5376


def test_iter_pairs_absent_grads_stay_absent() -> None:
    data = read_report(DATA / "host-compile-cpu.json").data
    assert data is not None
    rows = {(r.impl, r.other, r.case_id): r for r in iter_pairs(data)}
    assert list(rows[("fwdonly", "eager", "257")].tensors) == ["out"]
    specials = rows[("numba", "eager", "257-specials")].tensors
    assert specials["out"]["max_abs"] == "inf" and specials["out"]["nan_differ"] == 3


def test_foreign_report_with_bad_cmp_is_flagged(tmp_path: Path) -> None:
    data = json.loads(REFERENCE.read_text(encoding="utf-8"))
    del data["results"]["diffusers"]["vs rl_kernel"]["257"]["grads"]["gate"]["numel"]
    path = tmp_path / "foreign.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    loaded = read_report(path)
    assert loaded.origin == "foreign" and loaded.data is None
    assert loaded.problem is not None and "'numel' is a required property" in loaded.problem


def test_read_reports_mixed_directory(tmp_path: Path) -> None:
    shutil.copy(REFERENCE, tmp_path / "gate_residual_b200.json")
    shutil.copy(DATA / "corrupt.json", tmp_path / "corrupt.json")
    (tmp_path / "bench").mkdir()
    shutil.copy(DATA / "corrupt.json", tmp_path / "bench" / "skipped.json")
    loaded = read_reports(tmp_path)
    assert [(r.path.name, r.origin, r.ok) for r in loaded] == [
        ("corrupt.json", None, False),
        ("gate_residual_b200.json", "foreign", True),
    ]


def test_str_subclasses_such_as_torch_version_are_written(
    tmp_path: Path, good: dict[str, Any]
) -> None:
    """torch.__version__ is a str subclass; jsonschema-rs (when installed) refuses it."""
    torch = pytest.importorskip("torch")

    good["environment"]["torch"] = torch.__version__
    path = write_report(good, tmp_path)
    assert read_report(path).data["environment"]["torch"] == str(torch.__version__)
