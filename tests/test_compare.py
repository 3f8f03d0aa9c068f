"""runner.compare.accuracy against a plain numpy oracle, on fresh random values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from runner.compare import accuracy, ulp_at


def oracle(a: torch.Tensor, ref: torch.Tensor) -> dict:
    """The documented figures, computed element by element in numpy float64."""
    r = ref.double().numpy().reshape(-1)
    g = a.double().numpy().reshape(-1)
    keep = np.isfinite(r) & (np.abs(r) <= float(torch.finfo(a.dtype).max))
    r, g = r[keep], g[keep]
    out = {"finite": int(keep.sum())}
    if r.size == 0:
        return {**out, "max_abs": 0.0, "max_rel": 0.0, "rel_l2": 0.0, "max_abs_ulps": 0.0}
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(g - r)
    if not np.isfinite(err).all():
        return {**out, "max_abs": "inf", "max_rel": "inf", "rel_l2": "inf",
                "max_abs_ulps": "inf"}
    nz = r != 0
    norm = float(np.sqrt(np.sum(r * r)))
    return {**out, "max_abs": float(err.max()),
            "max_rel": float((err[nz] / np.abs(r[nz])).max()) if nz.any() else 0.0,
            "rel_l2": float(np.sqrt(np.sum(err * err))) / norm if norm else 0.0,
            "max_abs_ulps": float(err.max()) / ulp_at(float(np.abs(r).max()), a.dtype)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("plant", ["none", "zeros", "nonfinite_ref", "overflow", "nan_got",
                                   "inf_got"])
@pytest.mark.parametrize("block", [None, 7])
def test_accuracy_matches_a_numpy_oracle(fresh_seed: int, dtype: torch.dtype, plant: str,
                                         block: int | None, monkeypatch: pytest.MonkeyPatch):
    if block is not None:  # many blocks, with odd boundaries
        monkeypatch.setattr("runner.compare._BLOCK", block)
    gen = torch.Generator().manual_seed(fresh_seed)
    n = int(torch.randint(1, 5000, (1,), generator=gen))
    ref = torch.randn(n, generator=gen, dtype=torch.float64) * 10
    pick = torch.randint(0, n, (max(1, n // 50),), generator=gen)
    if plant == "zeros":
        ref[pick] = 0.0
    elif plant == "nonfinite_ref":
        ref[pick] = float("nan")
        ref[pick[: len(pick) // 2]] = float("inf")
    elif plant == "overflow":  # beyond the storage dtype: not counted against it
        ref[pick] = float(torch.finfo(dtype).max) * 4
    got = ref.to(dtype)
    if plant == "nan_got":
        got[pick] = float("nan")
    elif plant == "inf_got":  # one element, in whichever block it falls
        got[pick[0]] = -float("inf")
    want, have = oracle(got, ref), accuracy(got, ref)
    assert have.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, str) or key == "finite":
            assert have[key] == value, key
        else:
            assert math.isclose(have[key], value, rel_tol=1e-12, abs_tol=0.0), key


def test_accuracy_leaves_its_arguments_alone() -> None:
    ref = torch.tensor([1.0, -2.0, 0.0, 3.5], dtype=torch.float64)
    got = ref + 0.25  # float64 on the CPU: no copy is made on the way in
    before = (got.clone(), ref.clone())
    figures = accuracy(got, ref)
    assert torch.equal(got, before[0]) and torch.equal(ref, before[1])
    assert figures["max_abs"] == 0.25 and figures["finite"] == 4
