"""Input validation of the RMSNorm ops' GPU and CPU entry points.

Every error is a one-line :class:`kernels.errors.OpInputError` that starts with the op's
name, names the argument, what was expected and what was found, e.g.
``rms_norm: weight must be (D=8,), got (9,)``.
"""

from __future__ import annotations

import torch

from gate_residual_matrix.kernels.errors import OpInputError

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INDEX_DTYPES = (torch.int64, torch.int32)


def dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous with a lazy negation or conjugation applied (the kernels read the
    storage through ``data_ptr()``)."""
    return t.resolve_neg().resolve_conj().contiguous()


def check_tensors(op: str, device: str, rows: dict, params: dict,
                  index: torch.Tensor | None = None) -> None:
    """Check types, device, dtypes and shapes.

    ``rows``: name -> (N, D) tensors (the first is the reference for N, D and dtype);
    ``params``: name -> expected shape as a tuple of "N", "D", "G" letters, e.g. ``("D",)``
    or ``("G", "D")`` (every "G" the same); ``index``: (N,) int64/int32 or None. All on one
    ``device`` type ("cuda" or "cpu"). Raises :class:`OpInputError`.
    """
    everything = {**rows, **{k: v[0] for k, v in params.items()}}
    if index is not None:
        everything["index"] = index
    for name, t in everything.items():
        if not isinstance(t, torch.Tensor):
            raise OpInputError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise OpInputError(f"{op}: {name} must be a dense tensor, got {t.layout}")
    devices = {t.device for t in everything.values()}
    if len(devices) != 1:
        found = ", ".join(f"{n}={t.device}" for n, t in everything.items())
        raise OpInputError(f"{op}: tensors are on different devices ({found})")
    (dev,) = devices
    if dev.type != device:
        raise OpInputError(f"{op}: expected {device} tensors, got {dev}")
    first_name, first = next(iter(rows.items()))
    if first.dtype not in FLOAT_DTYPES:
        raise OpInputError(f"{op}: {first_name} must be bfloat16, float16 or float32, got "
                           f"{first.dtype}")
    if first.dim() != 2:
        raise OpInputError(f"{op}: {first_name} must be (N, D), got {tuple(first.shape)}")
    sizes = {"N": first.shape[0], "D": first.shape[1]}
    for name, t in rows.items():
        if t.dtype != first.dtype:
            raise OpInputError(f"{op}: {name} is {t.dtype} but {first_name} is {first.dtype}")
        if t.shape != first.shape:
            raise OpInputError(f"{op}: {name} must be (N, D) = {tuple(first.shape)} like "
                               f"{first_name}, got {tuple(t.shape)}")
    for name, (t, letters) in params.items():
        if t.dtype != first.dtype:
            raise OpInputError(f"{op}: {name} is {t.dtype} but {first_name} is {first.dtype}")
        if "G" in letters and "G" not in sizes and t.dim() == len(letters):
            sizes["G"] = t.shape[letters.index("G")]
        want = tuple(sizes.get(k, -1) for k in letters)
        if tuple(t.shape) != want:
            shown = ", ".join(f"{k}={sizes[k]}" if k in sizes else k for k in letters)
            shown = f"({shown},)" if len(letters) == 1 else f"({shown})"
            raise OpInputError(f"{op}: {name} must be {shown}, got {tuple(t.shape)}")
    if index is not None:
        if index.dtype not in INDEX_DTYPES:
            raise OpInputError(f"{op}: index must be int64 or int32, got {index.dtype}")
        if index.dim() != 1 or index.shape[0] != sizes["N"]:
            raise OpInputError(f"{op}: index must be (N={sizes['N']},), got "
                               f"{tuple(index.shape)}")


def check_index_range(op: str, index: torch.Tensor, groups: int) -> None:
    """Index values in [0, G): reads two scalars back (one synchronisation on a GPU)."""
    if index.numel():
        lo, hi = (int(v) for v in torch.aminmax(index))
        if lo < 0 or hi >= groups:
            bad = lo if lo < 0 else hi
            raise OpInputError(f"{op}: index holds {bad}, outside [0, G={groups})")


__all__ = ["FLOAT_DTYPES", "INDEX_DTYPES", "check_index_range", "check_tensors", "dense"]
