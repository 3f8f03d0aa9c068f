"""Cases with a grouped index (``grouped: true``): the index sorted, so the rows that share
an index value are contiguous, as the tokens of one sample in a DiT batch are."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import yaml

from gate_residual_matrix import ops
from gate_residual_matrix.contract.inputs import build
from gate_residual_matrix.runner.config.matrix import parse_matrix
from gate_residual_matrix.runner.errors import ConfigError
from gate_residual_matrix.runner.reports.checks import ours_problems
from gate_residual_matrix.runner.reports.store import ReportError, validate
from gate_residual_matrix.runner.tables.model.cases import base_case, case_order
from tests.committed_reports import HOST_PLAIN_CPU

SIZES = {"D": 64, "G": 9}


def _index(n: int, grouped: bool, seed: int) -> np.ndarray:
    x = build(ops.get("rms_norm_scale_shift"), n=n, sizes=SIZES, dtype="bfloat16",
              index_dtype="int64", seed=seed, grouped=grouped)
    return x.tensors["index"].numpy()


@pytest.mark.parametrize("n", [2, 257, 4097])
def test_grouped_index_is_sorted_and_in_range(n):
    seed = int(np.random.default_rng().integers(0, 2**31))
    got = _index(n, True, seed)
    assert got.shape == (n,)
    assert (np.diff(got) >= 0).all()
    assert got.min() >= 0 and got.max() < SIZES["G"]
    assert (got == _index(n, True, seed)).all()  # a pure function of the arguments


def test_random_index_is_not_sorted_and_grouped_keys_its_own_streams():
    seed = int(np.random.default_rng().integers(0, 2**31))
    random = _index(4097, False, seed)
    grouped = _index(4097, True, seed)
    assert (np.diff(random) < 0).any()
    # the grouped case is its own case (id "4097-grouped"): fresh values, not a sorted copy
    assert not np.array_equal(np.sort(random, kind="stable"), grouped)
    x = build(ops.get("rms_norm_scale_shift"), n=257, sizes=SIZES, dtype="bfloat16",
              index_dtype="int64", seed=seed, grouped=True)
    assert x.case_id == "257-grouped"


FILES = {"rms_norm_scale_shift": "matrix-rms-norm-scale-shift.yaml",
         "rms_norm": "matrix-rms-norm.yaml"}


def _matrix(op: str, case: dict) -> dict:
    """The committed matrix file of ``op`` with ``case`` as its only case."""
    with open(FILES[op]) as fh:
        data = yaml.safe_load(fh)
    return {**data, "cases": [case]}


def test_grouped_case_ids():
    m = parse_matrix(_matrix("rms_norm_scale_shift", {"n": 257, "grouped": True,
                                                      "specials": True, "dtype": "float16",
                                                      "index_dtype": "int32"}))
    assert m.cases[0].base_id == "257-specials-grouped"
    assert m.cases[0].id == "257-specials-grouped-float16-int32"
    assert base_case("257-grouped-float16-int32") == "257-grouped"
    assert case_order(["257-specials", "257-grouped", "4097", "1"]) == [
        "1", "4097", "257-grouped", "257-specials"]


def test_grouped_needs_an_index():
    with pytest.raises(ConfigError) as err:
        parse_matrix(_matrix("rms_norm", {"n": 257, "grouped": True}))
    msg = str(err.value)
    assert "\n" not in msg and "cases[0].grouped" in msg and "has no index" in msg


def test_committed_matrix_has_grouped_cases():
    with open("matrix-rms-norm-scale-shift.yaml") as fh:
        m = parse_matrix(yaml.safe_load(fh), "matrix-rms-norm-scale-shift.yaml")
    assert {"257-grouped", "4097-grouped"} <= {c.id for c in m.cases}


def _with_grouped_case(report: dict, grouped_flag: bool | None) -> dict:
    """``report`` with its first case renamed ``<N>-grouped`` (inputs' flag as given)."""
    out = copy.deepcopy(report)
    old = str(out["cases"][0])
    new = f"{old}-grouped"
    out["cases"][0] = new
    inputs = out["inputs"].pop(old)
    if grouped_flag is not None:
        inputs["grouped"] = grouped_flag
    out["inputs"][new] = inputs
    for row in out["results"].values():
        for key, by_case in row.items():
            if key.startswith("vs ") and isinstance(by_case, dict) and old in by_case:
                by_case[new] = by_case.pop(old)
    return out


def test_report_checks_the_grouped_flag_against_the_case_id():
    report = json.loads(HOST_PLAIN_CPU.read_text())
    assert not [p for p in ours_problems(_with_grouped_case(report, True))
                if "grouped" in p]
    wrong = [p for p in ours_problems(_with_grouped_case(report, None)) if "grouped" in p]
    assert wrong and "the case id says True" in wrong[0]
    with pytest.raises(ReportError):
        validate(_with_grouped_case(report, False))  # the schema's const: true
