"""Inputs and eager reference for the indexed_scale_shift tests (imported by the test modules
and by scale_shift_sim_worker.py; not a test module itself).

Inputs are fresh per seed (torch's generator, CPU): ``kind="normal"`` draws standard normal
values (``scale`` and ``shift`` scaled by 0.5, like AdaLN rows), ``kind="bits"`` draws every
element's bit pattern uniformly (all exponents, subnormals, NaN payloads, infinities). With
``specials``, about 1 element in 7 of every float tensor is replaced by a special value (each
value at least once where the tensor has room for all):
contract.inputs' list (NaN, +-Inf, +-0.0, subnormals, +-max, products that overflow or
underflow) and, for ``scale``, values that make ``1 + scale`` interesting: -1 (t = +0.0),
-1 +- one ULP, +-eps/2 and 3*eps/2 (ties of ``1 + s`` in the storage dtype), -2 (t = -1).
"""

from __future__ import annotations

import torch

from gate_residual_matrix.contract.inputs import special_values

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
INDEX_DTYPES = {"int64": torch.int64, "int32": torch.int32}
INT_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}
FLOATS = ("x", "scale", "shift", "grad_out")


def scale_specials(dtype: torch.dtype) -> list[float]:
    """Values of ``scale`` around the roundings of ``1 + scale`` (exact in ``dtype``)."""
    eps = torch.finfo(dtype).eps
    return [-1.0, -1.0 + eps / 2, -1.0 - eps, eps / 2, -eps / 4, 1.5 * eps, -2.0,
            2.0 ** -30, -(2.0 ** -30)]


def _values(gen, shape, dtype: torch.dtype, kind: str, spread: float) -> torch.Tensor:
    if kind == "bits":
        view = INT_VIEW[dtype]
        info = torch.iinfo(view)
        return torch.randint(info.min, info.max + 1, shape, generator=gen,
                             dtype=torch.int64).to(view).view(dtype)
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * spread).to(dtype)


def _plant(gen, t: torch.Tensor, values: list[float]) -> torch.Tensor:
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return t
    where = torch.rand(flat.shape, generator=gen) < 1 / 7
    pick = torch.randint(0, len(values), flat.shape, generator=gen)
    table = torch.tensor(values, dtype=torch.float64).to(t.dtype)
    flat[where] = table[pick[where]]
    first = torch.randperm(flat.numel(), generator=gen)[:len(values)]  # each value at least
    flat[first] = table[:first.numel()]                                # once where it fits
    return t


def make_case(n: int, d: int, g: int, dtype: str, index_dtype: str, seed: int, *,
              specials: bool = True, kind: str = "normal") -> dict[str, torch.Tensor]:
    """CPU tensors ``x``, ``grad_out`` (N, D), ``scale``, ``shift`` (G, D), ``index`` (N,)."""
    gen = torch.Generator().manual_seed(seed)
    dt = TORCH_DTYPES[dtype]
    x = {"x": _values(gen, (n, d), dt, kind, 1.0),
         "scale": _values(gen, (g, d), dt, kind, 0.5),
         "shift": _values(gen, (g, d), dt, kind, 0.5),
         "grad_out": _values(gen, (n, d), dt, kind, 1.0)}
    if specials:
        common = [float(v) for v in special_values(dtype)]
        for name in FLOATS:
            extra = scale_specials(dt) if name == "scale" else []
            _plant(gen, x[name], common + extra)
    x["index"] = torch.randint(0, max(g, 1), (n,), generator=gen).to(INDEX_DTYPES[index_dtype])
    return x


def eager(x: dict[str, torch.Tensor]):
    """Eager PyTorch with autograd on ``x``'s device: (out, grad_x, grad_scale, grad_shift)."""
    xx, ss, hh = (x[k].clone().requires_grad_() for k in ("x", "scale", "shift"))
    out = xx * (1 + ss.index_select(0, x["index"])) + hh.index_select(0, x["index"])
    out.backward(x["grad_out"])
    return out.detach(), xx.grad, ss.grad, hh.grad


def storage(t: torch.Tensor):
    """numpy array of a CPU tensor's storage elements as the kernels take them (bfloat16 as
    int16 bits), a copy."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().copy()
    return t.numpy().copy()


def from_storage(a, dtype: str) -> torch.Tensor:
    """Inverse of :func:`storage`."""
    t = torch.from_numpy(a)
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t
