"""contract.compare.accuracy against a plain numpy oracle, on fresh random values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gate_residual_matrix.contract import compare
from gate_residual_matrix.contract.compare import accuracy, ulp_at


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
        monkeypatch.setattr("gate_residual_matrix.contract.compare._BLOCK", block)
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


def bitwise_oracle(a: torch.Tensor, b: torch.Tensor) -> dict:
    """contract.compare.bitwise's figures, element by element in numpy over the whole tensor."""
    width = {torch.bfloat16: 16, torch.float16: 16, torch.float32: 32, torch.float64: 64}
    ia = a.reshape(-1).view(getattr(torch, f"int{width[a.dtype]}")).numpy().astype(np.int64)
    ib = b.reshape(-1).view(getattr(torch, f"int{width[a.dtype]}")).numpy().astype(np.int64)
    fa, fb = a.reshape(-1).double().numpy(), b.reshape(-1).double().numpy()
    idx = np.flatnonzero(ia != ib)
    nan = np.isnan(fa[idx]) | np.isnan(fb[idx])
    both = np.isnan(fa[idx]) & np.isnan(fb[idx])
    rest = idx[~nan]

    def order(i: np.ndarray) -> np.ndarray:
        magnitude = i & ((1 << (width[a.dtype] - 1)) - 1)
        return np.where(i < 0, -magnitude - 1, magnitude)

    with np.errstate(all="ignore"):
        diff = np.abs(fa[rest] - fb[rest])
    diff[np.isnan(diff)] = np.inf
    max_abs = float(diff.max()) if rest.size else 0.0
    return {"equal": idx.size == 0, "differ": int(idx.size), "numel": int(ia.size),
            "max_abs": "inf" if np.isinf(max_abs) else max_abs,
            "max_ulp": 0 if idx.size == 0 else (
                int(np.abs(order(ia[rest]) - order(ib[rest])).max()) if rest.size else None),
            "nan_differ": int(nan.sum()), "nan_payload_differ": int(both.sum()),
            "first_differ": int(idx[0]) if idx.size else None}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("block", [None, 5])
@pytest.mark.parametrize("plant", ["none", "specials", "equal", "only_nan"])
def test_bitwise_matches_a_numpy_oracle(fresh_seed: int, dtype: torch.dtype, block, plant,
                                        monkeypatch: pytest.MonkeyPatch):
    """Blocks of 5 elements (many, with odd boundaries) or the default: the same figures as
    the whole tensor's, with NaN payloads, +-Inf, +-0.0, subnormals and extremes planted."""
    if block is not None:
        monkeypatch.setattr("gate_residual_matrix.contract.compare._CMP_BLOCK", block)
    gen = torch.Generator().manual_seed(fresh_seed)
    n = int(torch.randint(1, 3000, (1,), generator=gen))
    a = torch.randn(n, generator=gen, dtype=torch.float64).to(dtype)
    b = a.clone()
    pick = torch.randint(0, n, (max(1, n // 20),), generator=gen)
    if plant != "equal":
        b[pick] = (a[pick].double() * (1 + 2 ** -6)).to(dtype)
    if plant == "specials":
        info = torch.finfo(dtype)
        values = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, info.tiny / 4,
                  info.max, -info.max]
        for k, v in enumerate(values):
            a[pick[k % len(pick)]] = v
            b[pick[(k + 1) % len(pick)]] = v
        ints = b.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[b.element_size()])
        ints[pick[-1]] = ints[pick[-1]] | 1  # whatever it holds, another bit pattern
        a[pick[-1]] = float("nan")
    if plant == "only_nan":
        a[pick] = float("nan")
    assert compare.bitwise(a, b) == bitwise_oracle(a, b)
