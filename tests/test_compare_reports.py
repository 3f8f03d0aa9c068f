"""``compare``: every verdict that changed between two report sets, gated by rules
(runner/compare_reports/; docs/ci.md).

Fabricated pairs start from a real H200 report (tests/data/h200/host-plain-cuda.json: five
cases, eager, numba, fp64) and change one verdict on one side, so each rule is seen firing,
with its exit code; a real pair is the committed CPU cell at two commits (``git show``).
Everything runs through ``python -m gate_residual_matrix compare`` in this process (``main``).
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gate_residual_matrix.runner.__main__ import main
from gate_residual_matrix.runner.compare_reports import RULES, Rules, compare, load_set
from tests.committed_reports import REFERENCE, committed_reports

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "tests" / "data" / "h200" / "host-plain-cuda.json"
NUMEL = 1381632  # out at N = 257, D = 5376


def report() -> dict[str, Any]:
    return json.loads(H200.read_text())


def save(data: dict[str, Any], directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{data['cell']['id']}.json").write_text(json.dumps(data))
    return directory


def cmp(differ: int, numel: int = NUMEL, nan: int = 0, payload: int = 0) -> dict[str, Any]:
    """A CMP with ``differ`` differing elements, ``nan`` of them NaN on a side, ``payload``
    NaN on both."""
    return {"equal": differ == 0, "differ": differ, "numel": numel,
            "max_abs": 0.0 if differ == nan else 0.5, "max_ulp": 0 if differ == nan else 3,
            "nan_differ": nan, "nan_payload_differ": payload,
            "first_differ": None if differ == 0 else 7}


def set_cmp(data: dict[str, Any], case: str, tensor: str, value: dict[str, Any],
            a: str = "numba", b: str = "eager") -> None:
    """The CMP of ``a`` vs ``b`` in ``case``, in both directions of the pair."""
    for x, y in ((a, b), (b, a)):
        entry = data["results"][x].get(f"vs {y}")
        if entry is None:
            continue
        if tensor == "out":
            entry[case]["out"] = [dict(value)]
        else:
            entry[case]["grads"][tensor] = dict(value)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["compare", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def compared(tmp_path: Path, capsys, base: dict[str, Any], new: dict[str, Any],
             *options: str) -> tuple[int, dict[str, Any], str, str]:
    """Compare ``base`` with ``new``; (exit code, compare.json, stdout, stderr)."""
    b, n, out = tmp_path / "base", tmp_path / "new", tmp_path / "out"
    save(base, b)
    save(new, n)
    code, stdout, stderr = run(capsys, str(b), str(n), "--compare-out", str(out), *options)
    doc = json.loads((out / "compare.json").read_text()) if (out / "compare.json").exists() \
        else {}
    return code, doc, stdout, stderr


def repeat(data: dict[str, Any], impl: str, case: str, tensor: str, value: bool) -> None:
    data["results"][impl]["repeatable"][case][tensor] = value


def accuracy(data: dict[str, Any], impl: str, case: str, ulps: float) -> None:
    data["results"][impl]["accuracy"][case]["out"]["max_abs_ulps"] = ulps


def batch(data: dict[str, Any], case: str, sub_batches: bool) -> None:
    data["results"]["numba"]["batch_invariant"] = {case: {  # the fields agree, as checked
        "row_alone": True, "sub_batches": sub_batches, "size_sweep": sub_batches,
        "first_failing_size": None if sub_batches else 3, "max_size": 9}}


def across(data: dict[str, Any], case: str, value: bool) -> None:
    data["results"]["numba"]["repeatable_across_processes"] = {case: {"out": value}}


def failed_status(data: dict[str, Any]) -> None:
    data["status"], data["reason"] = "error", "failed on purpose"


def impl_failed(data: dict[str, Any]) -> None:
    data["results"]["numba"]["status"] = "error"
    data["results"]["numba"]["reason"] = "case 257: RuntimeError: failed on purpose"


def other_inputs(data: dict[str, Any]) -> None:
    data["inputs"]["257"]["sha256"]["residual"] = "f" * 64


# rule -> (edit the baseline, edit the new report, (subject, case, tensor) of the change);
# each edit leaves everything else as the real report has it
CASES: dict[str, tuple[Any, Any, tuple[str, str, str]]] = {
    "bits:equal->differ": (None, lambda d: set_cmp(d, "257", "out", cmp(3)),
                           ("numba vs eager", "257", "out")),
    "bits:equal->nan_payload": (None, lambda d: set_cmp(d, "257", "out", cmp(3, nan=3, payload=3)),
                                ("numba vs eager", "257", "out")),
    "bits:nan_payload->differ": (lambda d: set_cmp(d, "257", "out", cmp(3, nan=3, payload=3)),
                                 lambda d: set_cmp(d, "257", "out", cmp(3, nan=1)),
                                 ("numba vs eager", "257", "out")),
    "bits:differ->equal": (lambda d: set_cmp(d, "257", "out", cmp(3)), None,
                           ("numba vs eager", "257", "out")),
    "bits:nan_payload->equal": (lambda d: set_cmp(d, "257", "out", cmp(2, nan=2, payload=2)),
                                None, ("numba vs eager", "257", "out")),
    "bits:differ->nan_payload": (lambda d: set_cmp(d, "257", "out", cmp(2)),
                                 lambda d: set_cmp(d, "257", "out", cmp(2, nan=2, payload=2)),
                                 ("numba vs eager", "257", "out")),
    "repeatable:yes->no": (None, lambda d: repeat(d, "numba", "1", "out", False),
                           ("numba", "1", "out")),
    "repeatable:no->yes": (lambda d: repeat(d, "numba", "1", "out", False), None,
                           ("numba", "1", "out")),
    "across_processes:yes->no": (lambda d: across(d, "1", True), lambda d: across(d, "1", False),
                                 ("numba", "1", "out")),
    "across_processes:no->yes": (lambda d: across(d, "1", False), lambda d: across(d, "1", True),
                                 ("numba", "1", "out")),
    "batch_invariant:yes->no": (lambda d: batch(d, "1", True), lambda d: batch(d, "1", False),
                                ("numba", "1", "")),
    "batch_invariant:no->yes": (lambda d: batch(d, "1", False), lambda d: batch(d, "1", True),
                                ("numba", "1", "")),
    "differ_fraction:grew": (lambda d: set_cmp(d, "257", "out", cmp(3)),
                             lambda d: set_cmp(d, "257", "out", cmp(5)),
                             ("numba vs eager", "257", "out")),
    "differ_fraction:shrank": (lambda d: set_cmp(d, "257", "out", cmp(5)),
                               lambda d: set_cmp(d, "257", "out", cmp(3)),
                               ("numba vs eager", "257", "out")),
    "error:grew": (lambda d: accuracy(d, "numba", "1", 0.25),
                   lambda d: accuracy(d, "numba", "1", 0.5), ("numba", "1", "out")),
    "error:shrank": (lambda d: accuracy(d, "numba", "1", 0.5),
                     lambda d: accuracy(d, "numba", "1", 0.25), ("numba", "1", "out")),
    "cell_status:worse": (None, failed_status, ("cell", "", "")),
    "cell_status:better": (failed_status, None, ("cell", "", "")),
    "cell_status:skipped": (None, lambda d: d.update(status="skipped", reason="no GPU (test)"),
                            ("cell", "", "")),
    "impl_status:worse": (None, impl_failed, ("numba", "", "")),
    "impl_status:better": (impl_failed, None, ("numba", "", "")),
    "inputs:changed": (None, other_inputs, ("inputs", "257", "")),
}


def test_every_rule_has_a_fabricated_pair() -> None:
    assert set(CASES) == set(RULES)


def pair_for(rule: str) -> tuple[dict[str, Any], dict[str, Any]]:
    base, new = report(), report()
    edit_base, edit_new, _ = CASES[rule]
    for edit, data in ((edit_base, base), (edit_new, new)):
        if edit is not None:
            edit(data)
    return base, new


@pytest.mark.parametrize("rule", list(CASES))
def test_each_rule_fires_with_its_default_and_its_exit_code(rule, tmp_path, capsys) -> None:
    code, doc, out, err = compared(tmp_path, capsys, *pair_for(rule))
    subject, case, tensor = CASES[rule][2]
    labels = {"out": "out", "": ""}
    mine = [c for c in doc["changes"] if c["rule"] == rule]
    assert [(c["subject"], c["case"], c["tensor"]) for c in mine] == [
        (subject, case, labels[tensor])], doc["changes"]
    assert [c for c in doc["changes"] if c["rule"] != rule] == []  # nothing else moved
    if RULES[rule]:
        assert code == 6, err
        assert mine[0]["verdict"] == "REGRESSED" and doc["regressed"] and doc["exit_code"] == 6
        assert err.startswith("error: 1 verdict(s) regressed against ") and err.count("\n") == 1
        assert f": {rule} (" in err, err
        assert f"REGRESSED {doc['cells']['matched'][0]}" in out
    else:
        assert code == 0, err
        assert mine[0]["verdict"] == "allowed" and not doc["regressed"] and err == ""


def test_the_committed_reports_pass_against_themselves(tmp_path, capsys) -> None:
    committed = committed_reports(tmp_path / "committed")
    code, out, err = run(capsys, str(committed), str(committed),
                         "--compare-out", str(tmp_path))
    doc = json.loads((tmp_path / "compare.json").read_text())
    assert (code, err, doc["changes"], doc["cells"]["only_new"]) == (0, "", [], [])
    assert len(doc["cells"]["matched"]) >= 10 and "0 regressed" in out


def test_a_cell_skipped_here_is_not_compared_unless_the_rules_say(tmp_path, capsys) -> None:
    """A CPU host runs no cuda cell: ``ok`` -> ``skipped`` is allowed, nothing of the cell is
    compared (its figures may still be in the file); ``--fail cell_status:skipped`` gates."""
    base, new = pair_for("cell_status:skipped")
    set_cmp(new, "257", "out", cmp(3))  # not compared: the cell did not run
    code, doc, _, _ = compared(tmp_path, capsys, base, new)
    assert (code, [c["rule"] for c in doc["changes"]]) == (0, ["cell_status:skipped"])
    assert doc["notes"]["host-plain-cuda"] == ["skipped in the new set: no GPU (test)"]
    code, _, _, err = compared(tmp_path, capsys, base, new, "--fail", "cell_status:skipped")
    assert code == 6 and "cell: cell_status:skipped (ok → skipped)" in err, err


def test_an_unchanged_set_passes_and_writes_both_outputs(tmp_path, capsys) -> None:
    code, doc, out, err = compared(tmp_path, capsys, report(), report())
    assert (code, err, doc["changes"], doc["regressed"]) == (0, "", [], False)
    assert doc["schema"] == "gate_residual_compare/1" and doc["compared"]["host-plain-cuda"] > 50
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "_No verdict changed._" in md and "| host-plain-cuda | both |" in md.replace("  ", "")
    assert "0 regressed, 0 allowed, 0 unstable" in out


def test_a_change_where_a_side_is_not_repeatable_is_unstable_unless_gated(tmp_path,
                                                                          capsys) -> None:
    """eager's grad_gate is not repeatable on the H200 (atomics): its pair's differing share
    moves from run to run, so a change there is shown but not gated."""
    base, new = report(), report()
    assert base["results"]["eager"]["repeatable"]["257"]["gate"] is False
    set_cmp(new, "257", "gate", cmp(40000, numel=48384))
    code, doc, _, _ = compared(tmp_path, capsys, base, new)
    (change,) = doc["changes"]
    assert (code, change["rule"], change["verdict"]) == (0, "differ_fraction:grew", "unstable")
    rules = tmp_path / "rules.yaml"
    rules.write_text("gate_unstable: true\n")
    code, doc, _, err = compared(tmp_path, capsys, base, new, "--rules", str(rules))
    assert (code, doc["changes"][0]["verdict"]) == (6, "REGRESSED"), err
    assert "numba vs eager grad_gate: differ_fraction:grew" in err


def test_allow_and_fail_override_the_defaults(tmp_path, capsys) -> None:
    base, new = pair_for("bits:equal->differ")
    code, doc, _, _ = compared(tmp_path, capsys, base, new, "--allow", "bits:equal->differ")
    assert (code, doc["changes"][0]["verdict"]) == (0, "allowed")
    code, _, _, _ = compared(tmp_path, capsys, new, base, "--fail", "bits:differ->equal")
    assert code == 6


@pytest.mark.parametrize("suffix", [".yaml", ".toml"])
def test_a_rules_file_sets_rules_and_tolerances(tmp_path, capsys, suffix) -> None:
    base, new = pair_for("differ_fraction:grew")  # 3 -> 5 of 1381632: below 1e-5
    rules = tmp_path / f"rules{suffix}"
    rules.write_text('allow = ["inputs:changed"]\nfail = ["bits:differ->equal"]\n'
                     "[tolerance]\ndiffer_fraction = 0.00001\n" if suffix == ".toml" else
                     'allow: ["inputs:changed"]\nfail: ["bits:differ->equal"]\n'
                     "tolerance: {differ_fraction: 0.00001}\n")
    code, doc, _, _ = compared(tmp_path, capsys, base, new, "--rules", str(rules))
    assert (code, doc["changes"]) == (0, [])
    assert "inputs:changed" in doc["rules"]["allow"] and "bits:differ->equal" in doc["rules"][
        "fail"] and doc["rules"]["tolerance"]["differ_fraction"] == 0.00001
    # the command line's --fail wins over the file's allow
    base, new = pair_for("inputs:changed")
    code, _, _, _ = compared(tmp_path, capsys, base, new, "--rules", str(rules), "--fail",
                             "inputs:changed")
    assert code == 6


def test_an_error_within_its_relative_tolerance_did_not_grow(tmp_path) -> None:
    base, new = report(), report()
    accuracy(base, "numba", "1", 0.5)
    accuracy(new, "numba", "1", 0.52)
    sets = [load_set(save(data, tmp_path / name), name) for name, data in (("b", base),
                                                                            ("n", new))]
    assert [c.rule for c in compare(*sets, Rules()).changes] == ["error:grew"]
    assert compare(*sets, Rules(error_tolerance=0.05)).changes == []
    assert [c.rule for c in compare(sets[1], sets[0], Rules()).changes] == ["error:shrank"]


BAD_RULES = [
    ("unknown rule", "fail: [bits:equal->dif]\n", "unknown rule 'bits:equal->dif'; choose from"),
    ("not a list", "allow: error:grew\n", "allow: expected a list of rule names"),
    ("unknown key", "fial: []\n", "unknown key 'fial'; choose from fail, allow"),
    ("fraction above 1", "tolerance: {differ_fraction: 2}\n",
     "tolerance.differ_fraction: expected a number in [0, 1], got 2"),
    ("negative error", "tolerance: {error: -1}\n", "tolerance.error: expected a number >= 0"),
    ("bad YAML", "fail: [\n", "invalid yaml"),
    ("not a mapping", "- a\n", "expected a mapping of fail, allow"),
    ("gate not bool", "gate_unstable: 1\n", "gate_unstable: expected true or false"),
]


@pytest.mark.parametrize(("text", "fragment"), [b[1:] for b in BAD_RULES],
                         ids=[b[0] for b in BAD_RULES])
def test_bad_rules_are_exit_2_in_one_line(tmp_path, capsys, text, fragment) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(text)
    save(report(), tmp_path / "a")
    code, _, err = run(capsys, str(tmp_path / "a"), str(tmp_path / "a"), "--rules", str(rules),
                       "--compare-out", str(tmp_path / "out"))
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert fragment in err, err
    assert not (tmp_path / "out").exists()


def test_an_unknown_rule_on_the_command_line_is_exit_2(tmp_path, capsys) -> None:
    save(report(), tmp_path / "a")
    code, _, err = run(capsys, str(tmp_path / "a"), str(tmp_path / "a"), "--allow", "equal")
    assert code == 2 and "--allow/--fail: unknown rule 'equal'" in err and err.count("\n") == 1


def foreign_only(directory: Path) -> None:
    directory.mkdir()
    (directory / "b200.json").write_bytes(
        REFERENCE.read_bytes())


def elsewhere(data: dict[str, Any]) -> dict[str, Any]:
    """The same report as a cell of another stack."""
    data = copy.deepcopy(data)
    data["cell"]["stack"], data["cell"]["id"] = "other", "other-plain-cuda"
    return data


BAD_INPUT = [
    ("missing dir", lambda d: None, "BASELINE_DIR: expected a directory of reports, got",
     "(no such directory)"),
    ("a file", lambda d: d.write_text("{}"), "BASELINE_DIR: expected a directory", "(not a "
     "directory)"),
    ("corrupt report", lambda d: (save(report(), d), (d / "x.json").write_text('{"schema_')),
     "BASELINE_DIR: ", "x.json: "),
    ("invalid report", lambda d: save({**report(), "status": "fine"}, d), "BASELINE_DIR: ",
     "host-plain-cuda.json: invalid report: status"),
    ("foreign only", foreign_only, "BASELINE_DIR: ", "only 1 foreign report(s)"),
    ("empty dir", lambda d: d.mkdir(), "BASELINE_DIR: ", ": no report; nothing of this runner"),
    ("no common cells", lambda d: save(elsewhere(report()), d), "no common cells: ",
     "has other-plain-cuda (NVIDIA H200);"),
]


@pytest.mark.parametrize(("make", "start", "fragment"), [b[1:] for b in BAD_INPUT],
                         ids=[b[0] for b in BAD_INPUT])
def test_bad_input_is_exit_2_in_one_line(tmp_path, capsys, make, start, fragment) -> None:
    base = tmp_path / "base"
    make(base)
    new = save(report(), tmp_path / "new")
    code, _, err = run(capsys, str(base), str(new), "--compare-out", str(tmp_path / "out"))
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {start}") and fragment in err, err
    assert not (tmp_path / "out").exists()


def keep_cases(data: dict[str, Any], keep: set[str]) -> dict[str, Any]:
    """``data`` with only the cases ``keep`` (ids as strings), in every per-case map."""
    every = {str(c) for c in data["cases"]}

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items() if k not in every or k in keep}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    out = walk(data)
    out["cases"] = [c for c in data["cases"] if str(c) in keep]
    return out


def test_no_common_case_is_exit_2(tmp_path, capsys) -> None:
    """The same cell, but the new report holds no case of the baseline's (each a whole,
    consistent report of other cases)."""
    base, new = keep_cases(report(), {"1", "257"}), keep_cases(report(), {"4097"})
    code, _, _, err = compared(tmp_path, capsys, base, new)
    assert code == 2 and "no common cases" in err, err


def test_a_library_row_is_matched_across_versions(tmp_path, capsys) -> None:
    """numba stands in for a library row of version 0.5.23 before and 0.5.24 after."""

    def as_version(data: dict[str, Any], version: str) -> dict[str, Any]:
        text = json.dumps(data).replace('"numba"', f'"lib_gate-{version}"').replace(
            '"vs numba"', f'"vs lib_gate-{version}"')
        return json.loads(text)

    base, new = report(), report()
    set_cmp(new, "257", "out", cmp(3))
    code, doc, _, err = compared(tmp_path, capsys, as_version(base, "0.5.23"),
                                   as_version(new, "0.5.24"))
    assert code == 6, err
    assert doc["matched_across_versions"] == {"host-plain-cuda": ["lib_gate-0.5.23→0.5.24"]}
    (change,) = doc["changes"]
    assert (change["subject"], change["rule"]) == ("lib_gate-0.5.23→0.5.24 vs eager",
                                                   "bits:equal->differ")


def test_a_baseline_inside_the_new_set_is_not_read_as_part_of_it(tmp_path, capsys) -> None:
    """``compare reports/known-good reports``: the new set leaves the baseline's files out
    (else they would be a second report of each cell)."""
    base, new = pair_for("bits:equal->differ")
    save(new, tmp_path / "reports")
    save(base, tmp_path / "reports" / "known-good")
    code, _, err = run(capsys, str(tmp_path / "reports" / "known-good"),
                       str(tmp_path / "reports"), "--compare-out", str(tmp_path / "out"))
    assert code == 6 and ": bits:equal->differ (equal → 3/1381632 differ; cases 257)" in err, err


def git_show(commit: str, path: str, directory: Path) -> Path:
    done = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{path}"],
                          capture_output=True, check=False)
    assert done.returncode == 0, (f"git show {commit}:{path} failed (a shallow clone? fetch the "
                                  f"history): {done.stderr.decode()[:200]}")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / Path(path).name).write_bytes(done.stdout)
    return directory


# the CPU cell at 3784642 (committed in fb71120) and at 20379bc (f85e9ff): the same bits but
# for compiled's and compiled_emulate's grad_gate, not repeatable in both
BEFORE, AFTER = "fb71120", "f85e9ff"


def test_a_real_pair_of_the_cpu_cell_at_two_commits(tmp_path, capsys) -> None:
    base = git_show(BEFORE, "reports/host-plain-cpu.json", tmp_path / "before")
    new = git_show(AFTER, "reports/host-plain-cpu.json", tmp_path / "after")
    code, out, err = run(capsys, str(base), str(new), "--compare-out", str(tmp_path / "o"))
    doc = json.loads((tmp_path / "o" / "compare.json").read_text())
    assert (code, err) == (0, "")
    assert doc["compared"]["host-plain-cpu"] > 900
    assert doc["changes"], "the two commits' compiled grad_gate differ: something must show"
    for change in doc["changes"]:
        assert change["subject"].split(" vs ")[0] in ("compiled", "compiled_emulate"), change
        assert (change["tensor"], change["verdict"]) == ("grad_gate", "unstable"), change
    assert any("project commit: 3784642" in line for line in doc["setup"]["host-plain-cpu"])
    # the same pair with numba's out in case 257 edited to differ: regressed, named
    edited = json.loads((new / "host-plain-cpu.json").read_text())
    set_cmp(edited, "257", "out", cmp(11))
    save(edited, new)
    code, out, err = run(capsys, str(base), str(new), "--compare-out", str(tmp_path / "o"))
    assert code == 6, err
    assert "host-plain-cpu: numba vs eager out: bits:equal->differ (equal → 11/1381632 differ; " \
           "cases 257)" in err, err
    assert "REGRESSED host-plain-cpu: numba vs eager out: bits:equal->differ" in out
