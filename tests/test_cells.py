"""Tests for runner.plan.cells: expansion order, cell ids, selecting cells and cases."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from gate_residual_matrix.runner.config.matrix import Matrix, load_matrix, parse_matrix
from gate_residual_matrix.runner.errors import ConfigError, SelectionError
from gate_residual_matrix.runner.plan.cells import Cell, cases_on, expand, select, select_cases

MATRIX = Path(__file__).parent.parent / "matrix.yaml"


@pytest.fixture
def matrix() -> Matrix:
    """Two stacks, three modes, two targets: 12 cells."""
    data = yaml.safe_load(MATRIX.read_text())
    data["stacks"] = {"host": {"kind": "host"}, "host2": {"kind": "host"}}
    data["modes"] = {"plain": {}, "det": {"torch": {"deterministic": True}}, "tf32.on": {}}
    data["targets"] = ["cpu", "cuda"]
    return parse_matrix(data)


def ids(cells: tuple[Cell, ...]) -> list[str]:
    return [c.id for c in cells]


def test_shipped_matrix_expands() -> None:
    matrix = load_matrix(MATRIX)
    modes = ["plain", "deterministic", "tf32", "inference", "vllm_batch_invariant",
             "sglang_ieee"]
    per_stack = [f"{m}-{t}" for m in modes for t in ("cuda", "cpu")
                 if t == "cuda" or m in ("plain", "deterministic")]
    assert ids(expand(matrix)) == [f"{s}-{c}" for s in matrix.stacks for c in per_stack]
    assert ids(expand(matrix))[:4] == ["host-plain-cuda", "host-plain-cpu",
                                       "host-deterministic-cuda", "host-deterministic-cpu"]


def test_mode_targets_limit_its_cells(matrix: Matrix) -> None:
    data = matrix.to_dict()
    data["modes"]["det"]["targets"] = ["cuda"]
    data["stacks"] = {"host": {"kind": "host"}}
    cells = expand(parse_matrix(data))
    assert ids(cells) == ["host-plain-cpu", "host-plain-cuda", "host-det-cuda",
                          "host-tf32.on-cpu", "host-tf32.on-cuda"]
    # says why, not all the cells: the mode's targets
    with pytest.raises(SelectionError,
                       match=r"^no cell matches --mode det, --target cpu; mode det runs on cuda$"):
        select(cells, modes=["det"], targets=["cpu"])
    with pytest.raises(SelectionError, match=r"; mode det runs on cuda; stack host runs on "
                                             r"cpu/cuda$"):
        select(cells, modes=["det"], stacks=["host"], targets=["cpu"])


def test_cases_on_a_target(matrix: Matrix) -> None:
    data = matrix.to_dict()
    data["cases"] = [{"n": 1}, {"n": 2, "targets": ["cuda"]}, {"n": 3, "dtype": "float16",
                                                               "targets": ["cpu"]}]
    m = parse_matrix(data)
    assert [c.id for c in cases_on(m.cases, "cpu")] == ["1", "3-float16-int64"]
    assert [c.id for c in cases_on(m.cases, "cuda")] == ["1", "2"]
    assert [c.id for c in select_cases(m, ["2", "3-float16-int64"])] == ["2", "3-float16-int64"]


def test_expansion_order_and_count(matrix: Matrix) -> None:
    cells = expand(matrix)
    assert len(cells) == 2 * 3 * 2 == len(set(cells))
    assert ids(cells) == [
        "host-plain-cpu", "host-plain-cuda", "host-det-cpu", "host-det-cuda",
        "host-tf32.on-cpu", "host-tf32.on-cuda",
        "host2-plain-cpu", "host2-plain-cuda", "host2-det-cpu", "host2-det-cuda",
        "host2-tf32.on-cpu", "host2-tf32.on-cuda",
    ]


def test_cell_is_frozen_and_hashable() -> None:
    cell = Cell("host", "plain", "cuda")
    assert (cell.stack, cell.mode, cell.target, cell.id) == ("host", "plain", "cuda",
                                                             "host-plain-cuda")
    assert cell == Cell("host", "plain", "cuda") and len({cell, Cell("host", "plain", "cuda")}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        cell.mode = "det"  # type: ignore[misc]


def test_select_nothing_keeps_all(matrix: Matrix) -> None:
    assert select(expand(matrix)) == expand(matrix)


@pytest.mark.parametrize(("filters", "expected"), [
    ({"targets": ["cuda"]}, ["host-plain-cuda", "host-det-cuda", "host-tf32.on-cuda",
                             "host2-plain-cuda", "host2-det-cuda", "host2-tf32.on-cuda"]),
    ({"stacks": ["host2"], "modes": ["det"]}, ["host2-det-cpu", "host2-det-cuda"]),
    ({"stacks": ["host2", "host"], "modes": ["tf32.on"], "targets": ["cpu"]},
     ["host-tf32.on-cpu", "host2-tf32.on-cpu"]),  # the cells' order, not the filter's
    ({"modes": "det", "targets": "cpu"}, ["host-det-cpu", "host2-det-cpu"]),  # str: one name
    ({"modes": ("det", "det"), "stacks": {"host"}}, ["host-det-cpu", "host-det-cuda"]),
])
def test_select(matrix: Matrix, filters: dict[str, object], expected: list[str]) -> None:
    assert ids(select(expand(matrix), **filters)) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(("filters", "message"), [
    ({"targets": ["gpu"]}, '--target: unknown target "gpu"; choose from cpu, cuda'),
    ({"stacks": ["host", "docker"]}, '--stack: unknown stack "docker"; choose from host, host2'),
    ({"modes": ["Plain"]}, '--mode: unknown mode "Plain"; choose from plain, det, tf32.on'),
    ({"modes": ['a"\nb']}, '--mode: unknown mode "a\\"\\nb"; choose from plain, det, tf32.on'),
])
def test_select_unknown_name_lists_allowed(matrix: Matrix, filters: dict[str, object],
                                           message: str) -> None:
    with pytest.raises(SelectionError) as info:
        select(expand(matrix), **filters)  # type: ignore[arg-type]
    assert str(info.value) == message
    assert isinstance(info.value, ConfigError)  # exit code 2, like a bad matrix.yaml


def test_select_shipped_unknown_target() -> None:
    expected = r'^--target: unknown target "gpu"; choose from cuda, cpu$'
    with pytest.raises(SelectionError, match=expected):
        select(expand(load_matrix(MATRIX)), targets=["gpu"])


def test_a_long_list_of_valid_values_is_cut_with_a_hint() -> None:
    """The first ten, then how many more and where they are: one short line, not every id."""
    from gate_residual_matrix.runner.plan.cells import CHOICES_SHOWN, choices_text

    ids = [f"case-{i}" for i in range(CHOICES_SHOWN + 20)]
    assert choices_text("case", ids) == (", ".join(ids[:CHOICES_SHOWN])
                                         + " ... (20 more; see matrix.yaml's cases)")
    assert choices_text("mode", ids[:CHOICES_SHOWN]) == ", ".join(ids[:CHOICES_SHOWN])
    assert choices_text("mode", []) == "nothing"


def test_select_allowed_values_come_from_the_cells(matrix: Matrix) -> None:
    cuda_only = select(expand(matrix), targets=["cuda"])
    with pytest.raises(SelectionError, match=r"choose from cuda$"):
        select(cuda_only, targets=["cpu"])


@pytest.mark.parametrize("filters", [{"targets": []}, {"stacks": [], "modes": ["det"]}])
def test_select_empty_result(matrix: Matrix, filters: dict[str, object]) -> None:
    with pytest.raises(SelectionError, match=r"^no cell matches .*; cells: host-plain-cpu, "):
        select(expand(matrix), **filters)  # type: ignore[arg-type]


def test_select_from_no_cells() -> None:
    with pytest.raises(SelectionError, match=r"^no cell matches the selection; cells: none$"):
        select(())


def test_select_cases_all_by_default(matrix: Matrix) -> None:
    assert select_cases(matrix) == matrix.cases


@pytest.mark.parametrize(("case_ids", "expected"), [
    (["257-specials", "1"], ["1", "257-specials"]),  # file order
    (["257"], ["257"]),
    ([257, "4097"], ["257", "4097"]),  # an int N is the case id str(N)
    ("32768", ["32768"]),
])
def test_select_cases(matrix: Matrix, case_ids: object, expected: list[str]) -> None:
    assert [c.id for c in select_cases(matrix, case_ids)] == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(("case_ids", "message"), [
    (["258"], '--case: unknown case "258"; choose from 1, 257, 4097, 32768, 257-specials'),
    (["257", "4097-specials"], '--case: unknown case "4097-specials"; choose from 1, 257, '),
    ([], "--case: no case selected; choose from 1, 257, 4097, 32768, 257-specials"),
])
def test_select_cases_errors(matrix: Matrix, case_ids: list[str], message: str) -> None:
    with pytest.raises(SelectionError) as info:
        select_cases(matrix, case_ids)
    assert str(info.value).startswith(message)
