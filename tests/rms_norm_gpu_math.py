"""The GPU's approximate float32 instructions (``MUFU.RCP``, ``MUFU.SQRT``, ``MUFU.RSQ``, as
emitted by ``kernels/rms_norm_ptx.py``) evaluated elementwise on the GPU, so that the numpy
oracle (tests/rms_norm_oracle.py) can use the hardware's results. Needs a CUDA device."""

from __future__ import annotations

import numpy as np
import torch

_KERNEL = []


def _kernel():
    if not _KERNEL:
        from numba import cuda

        from gate_residual_matrix.kernels.rms_norm_ptx import rcp_approx, rsqrt_approx, sqrt_approx

        @cuda.jit
        def unary(out, a, which):
            i = cuda.grid(1)
            if i < out.size:
                if which == 0:
                    out[i] = rcp_approx(a[i])
                elif which == 1:
                    out[i] = sqrt_approx(a[i])
                else:
                    out[i] = rsqrt_approx(a[i])

        _KERNEL.append(unary)
    return _KERNEL[0]


def _run(a, which: int) -> np.ndarray:
    a = np.asarray(a, np.float32)
    x = torch.from_numpy(np.ascontiguousarray(a).ravel()).cuda()
    out = torch.empty_like(x)
    if x.numel():
        _kernel()[max(1, -(-x.numel() // 256)), 256](out, x, which)
    return out.cpu().numpy().reshape(a.shape)


def rcp(a) -> np.ndarray:
    """``rcp.approx.ftz.f32`` of each element."""
    return _run(a, 0)


def sqrt(a) -> np.ndarray:
    """``sqrt.approx.ftz.f32`` of each element."""
    return _run(a, 1)


def rsqrt(a) -> np.ndarray:
    """``rsqrt.approx.ftz.f32`` of each element."""
    return _run(a, 2)
