"""A reference read by blocks of rows (contract/row_blocks.py) gives the figures and the sha256
of the whole tensor, and the runner frees a call's clones behind it (the CPU cell's
memory peak)."""

from __future__ import annotations

import pytest
import torch

from gate_residual_matrix.contract import compare
from gate_residual_matrix.contract.base import Implementation
from gate_residual_matrix.contract.row_blocks import RowBlocks
from gate_residual_matrix.ops.gate_residual import fp64
from gate_residual_matrix.runner.cell import case as case_run


def _inputs(n: int, dtype: torch.dtype, seed: int, d: int = 48) -> dict:
    gen = torch.Generator().manual_seed(seed)
    x = {"residual": torch.randn(n, d, generator=gen).to(dtype),
         "gate": torch.randn(9, d, generator=gen).to(dtype),
         "y": (torch.randn(n, d, generator=gen) * 300).to(dtype),
         "index": torch.randint(0, 9, (n,), generator=gen),
         "grad_out": torch.randn(n, d, generator=gen).to(dtype)}
    big = torch.finfo(dtype).max
    for name, value in (("y", float("nan")), ("y", float("inf")), ("residual", -float("inf")),
                        ("grad_out", -0.0), ("residual", 1e-40), ("gate", 1e-42),
                        ("residual", big), ("y", -big)):
        x[name].view(-1)[int(torch.randint(0, x[name].numel(), (1,), generator=gen))] = value
    return x


@pytest.mark.parametrize(("n", "dtype"), [(2500, torch.bfloat16), (1, torch.float16),
                                          (1031, torch.float32)])
def test_figures_and_sha256_by_row_blocks_equal_the_whole_tensors(n, dtype, monkeypatch):
    """Element blocks that end mid-row (the accuracy's own blocks, made small here) and
    blocks of rows that end mid-tensor: the same figures, bit for bit, and the same digest."""
    monkeypatch.setattr(compare, "_BLOCK", 1000)  # 1000 elements: blocks cut rows of 48
    x = _inputs(n, dtype, seed=n)
    lazy = fp64.run(x, backward=True)
    whole = {k: v.materialize() if isinstance(v, RowBlocks) else v for k, v in lazy.items()}
    eager = {"out": x["residual"] + x["gate"].index_select(0, x["index"]) * x["y"],
             "res": x["grad_out"], "y": x["grad_out"] * x["gate"].index_select(0, x["index"])}
    for k in ("out", "res", "y"):
        assert compare.tensor_sha256(lazy[k]) == compare.tensor_sha256(whole[k])
        got, want = compare.accuracy(eager[k], lazy[k]), compare.accuracy(eager[k], whole[k])
        assert got == want, k
        assert got["finite"] > 0


def test_a_call_frees_its_clones_behind_a_row_blocks_reference():
    x = _inputs(300, torch.bfloat16, seed=3)
    out, changed = case_run.call(fp64.FP64, x, backward=True)
    assert changed == []
    for k in ("out", "res", "y"):
        assert isinstance(out[k], RowBlocks)
        assert all(out[k].inputs[name] is x[name] for name in out[k].inputs)


def test_a_reference_that_writes_an_input_keeps_reading_its_own_clones():
    """A changed clone is reported, and the blocks go on reading what the call left."""

    def writes(inputs, *, backward):
        inputs["y"].mul_(2)
        return fp64.run(inputs, backward=backward)

    impl = Implementation(name="writer", source="test", has_backward=True, run=writes)
    x = _inputs(64, torch.float32, seed=4)
    out, changed = case_run.call(impl, x, backward=False)
    assert changed == ["y"]
    assert out["out"].inputs["y"] is not x["y"]
    doubled = dict(x, y=x["y"] * 2)
    assert torch.equal(compare.bits(out["out"].materialize()),
                       compare.bits(fp64.run(doubled, backward=False)["out"].materialize()))


def test_rows_of_the_wrong_shape_or_dtype_are_refused():
    x = {"a": torch.zeros(5, 3)}
    wrong = RowBlocks((5, 3), torch.float64, x, lambda t, i, j: t["a"][i:j].double()[:, :2])
    with pytest.raises(ValueError, match="came back as"):
        wrong.rows(0, 2)
    with pytest.raises(ValueError, match="block_rows"):
        RowBlocks((5, 3), torch.float64, x, lambda t, i, j: t["a"][i:j], block_rows=0)
    right = RowBlocks((5, 3), torch.float64, x, lambda t, i, j: t["a"][i:j].double(),
                      block_rows=2)
    assert right.materialize().shape == (5, 3) and right.numel() == 15
    with pytest.raises(ValueError, match="shapes differ"):
        compare.accuracy(torch.zeros(5, 2), right)


def test_block_figures_do_not_depend_on_where_the_reference_starts_in_memory():
    """A reference block whose elements start 1 or 3 float64s into its buffer (as a block of
    rows of an odd width does) gives the same figures, bit for bit: MKL's dot gives other
    last bits on data that is not 16-byte aligned (about half of these seeds did, with
    ``dot(r, r)``), so the sums of squares are taken over fresh tensors."""
    for seed in range(6):
        gen = torch.Generator().manual_seed(seed)
        n = (1 << 22) - 1000 * seed - 7
        ref = torch.randn(n, generator=gen, dtype=torch.float64) * 7
        got = (ref * (1 + torch.rand(n, generator=gen, dtype=torch.float64) * 1e-3)).to(
            torch.bfloat16)
        limit = torch.finfo(torch.bfloat16).max
        want = compare._block_figures(got, ref, limit, on_gpu=False)
        for offset in (1, 3):
            buffer = torch.empty(n + offset, dtype=torch.float64)
            buffer[offset:] = ref
            have = compare._block_figures(got, buffer[offset:], limit, on_gpu=False)
            assert torch.equal(have.view(torch.int64), want.view(torch.int64)), (seed, offset)
