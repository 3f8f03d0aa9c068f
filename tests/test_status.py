"""The status vocabulary (runner/status.py) is the report schema's."""

from __future__ import annotations

import json

import pytest

from gate_residual_matrix.runner.reports.store import SCHEMA_PATH
from gate_residual_matrix.runner.status import IMPL_STATUSES, SEVERITY, Status, worst
from gate_residual_matrix.runner.tables.model.values import STATUSES


def test_statuses_are_the_schemas():
    defs = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))["$defs"]
    assert {s.value for s in Status} == set(defs["cell_status"]["enum"])
    assert {s.value for s in IMPL_STATUSES} == set(defs["impl_status"]["enum"])
    assert set(SEVERITY) >= {*IMPL_STATUSES, Status.MISMATCH}
    assert STATUSES[:3] == ("ok", "mismatch", "error") and "partial" not in STATUSES


def test_members_are_plain_strings_in_reports():
    entry = {"status": Status.OOM}
    assert json.dumps(entry) == '{"status": "oom"}' and entry == {"status": "oom"}
    assert f"cell {Status.BUILD_ERROR}" == "cell build_error" and str(Status.OK) == "ok"


def test_worst_and_failed():
    assert worst(["ok", "unavailable"]) is Status.OK
    assert worst(["ok", "mismatch", "unavailable"]) is Status.MISMATCH
    assert worst(["mismatch", "error"]) is Status.ERROR and worst([]) is Status.OK
    assert [s.value for s in Status if s.failed] == ["error", "oom", "timeout", "build_error"]
    with pytest.raises(ValueError):
        worst(["crashed"])
