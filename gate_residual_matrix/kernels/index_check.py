"""The index check of the ops' CUDA entry points: ``check_index=True``, ``"sync"`` or ``False``.

Each kernel takes a one-element uint8 ``flag`` and sets it to 0 when it meets an index outside
[0, G); that row's output is NaN and no parameter row outside [0, G) is read. Per device there
are two flags: the *checked* one, which ``check_index=True`` calls clear and
:func:`assert_index` tests with ``torch._assert_async`` (no synchronisation; a bad index fails
at the next one, as eager's device-side assert does, and the CUDA context is unusable
afterwards in both), and a *sink* that unchecked calls (``False``, ``"sync"``, which checked on
the host) write and nobody reads.

Example::

    >>> index_mode("indexed_scale_shift", "sync")
    'sync'
"""

from __future__ import annotations

import torch

from gate_residual_matrix.kernels.errors import OpInputError

#: per CUDA device index: (checked flag, sink flag), uint8 tensors of one element, 1 = clean
_FLAGS: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def index_mode(op: str, check_index) -> bool | str:
    """``check_index`` if it is ``True``, ``False`` or ``"sync"``; else a one-line
    :class:`kernels.errors.OpInputError` naming ``op`` (a typo must not turn the check off)."""
    if isinstance(check_index, bool) or (isinstance(check_index, str) and check_index == "sync"):
        return check_index
    raise OpInputError(f'{op}: check_index must be True, False or "sync", got {check_index!r}')


def flags(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(checked flag, sink flag) of a CUDA device, made on first use."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    pair = _FLAGS.get(index)
    if pair is None:
        pair = _FLAGS[index] = (torch.ones(1, dtype=torch.uint8, device=device),
                                torch.ones(1, dtype=torch.uint8, device=device))
    return pair


def device_flag(device: torch.device, check_index) -> torch.Tensor:
    """The flag a launch passes: the checked one for ``check_index=True``, else the sink."""
    checked, sink = flags(device)
    return checked if check_index is True else sink


def assert_index(op: str, device: torch.device, check_index) -> None:
    """For ``check_index=True``: fail at the next synchronisation if a kernel cleared the flag."""
    if check_index is True:
        torch._assert_async(flags(device)[0], f"{op}: index holds a value outside [0, G)")


__all__ = ["assert_index", "device_flag", "flags", "index_mode"]
