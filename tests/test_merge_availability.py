"""A row that ran in one part of a merged report and was unavailable in the other (a library
file carried to one run and not to the next, say) is ``ok`` over the cases it ran, and its
reason names the others; the merge never labels measured cases ``unavailable``."""

from __future__ import annotations

from types import SimpleNamespace

from gate_residual_matrix.runner.reports.merge import merge_reports

MATRIX = SimpleNamespace(cases=[SimpleNamespace(id=c) for c in ("1", "255", "256", "257")])
WHY = "no _C_stable_libtorch.abi3.so of vllm 0.30.0 beside the kernel wheelhouse"


def _part(run: str, cases: list[str], status: str, reason: str | None) -> dict:
    ran = status == "ok"
    return {"run_id": run, "finished_at": f"{run}-end", "status": "ok", "cases": cases,
            "inputs": {c: {"seed": 1} for c in cases}, "environment": {},
            "results": {
                "eager": {"status": "ok", "reason": None,
                          "sha256": {c: {"out": f"e{c}"} for c in cases}},
                "ext": {"status": status, "reason": reason,
                        "sha256": {c: {"out": f"x{c}"} for c in cases} if ran else {}}}}


def test_ok_then_unavailable_keeps_ok_and_names_the_missing_cases():
    merged = merge_reports(_part("a", ["1", "255"], "ok", None),
                           _part("b", ["256", "257"], "unavailable", WHY), MATRIX)
    ext = merged["results"]["ext"]
    assert ext["status"] == "ok"
    assert ext["reason"] == f"unavailable in case(s) 256, 257: {WHY}"
    assert sorted(ext["sha256"]) == ["1", "255"]


def test_unavailable_then_ok_keeps_ok_and_names_the_old_cases():
    merged = merge_reports(_part("a", ["1", "255"], "unavailable", WHY),
                           _part("b", ["256", "257"], "ok", None), MATRIX)
    ext = merged["results"]["ext"]
    assert (ext["status"], ext["reason"]) == ("ok", f"unavailable in case(s) 1, 255: {WHY}")
    assert sorted(ext["sha256"]) == ["256", "257"]


def test_a_rerun_of_every_case_takes_the_new_status_alone():
    merged = merge_reports(_part("a", ["1", "255"], "ok", None),
                           _part("b", ["1", "255"], "unavailable", WHY), MATRIX)
    assert (merged["results"]["ext"]["status"], merged["results"]["ext"]["reason"]) == (
        "unavailable", WHY)


def test_parts_that_agree_are_unchanged():
    merged = merge_reports(_part("a", ["1"], "unavailable", WHY),
                           _part("b", ["256"], "unavailable", WHY), MATRIX)
    assert (merged["results"]["ext"]["status"], merged["results"]["ext"]["reason"]) == (
        "unavailable", WHY)
    assert merged["results"]["eager"]["reason"] is None
