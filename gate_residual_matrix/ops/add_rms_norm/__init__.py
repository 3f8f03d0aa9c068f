"""add_rms_norm: the residual stream of every transformer block, then its RMSNorm.

    h = x + residual                      (rounded to the storage dtype)
    out = h * rsqrt(mean(h ** 2, -1) + eps) * weight        (eps = 1e-6)

Two forward outputs, ``out`` and ``h`` (vLLM's ``fused_add_rms_norm`` writes them in place
into its input and residual). ``x``, ``residual``, ``grad_out``, ``grad_h``: (N, D);
``weight``: (D,). The backward takes an upstream gradient for each output (``grad_out``,
``grad_h``: the residual stream's); ``grad_x`` and ``grad_residual`` are both
``grad_h + dRMSNorm(grad_out)``, ``grad_weight`` the sum over rows of ``grad_out * n``.
Kernels: ``kernels/rms_norm*.py``; implementations: :mod:`ops.add_rms_norm.implementations`.
"""

from __future__ import annotations

from collections.abc import Mapping

from gate_residual_matrix.ops.rms_norm import EPS
from gate_residual_matrix.ops.spec import OpSpec, Output

__all__ = ["EPS", "SPEC", "bytes_moved"]


def bytes_moved(n: int, sizes: Mapping[str, int], itemsize: int) -> tuple[int, int]:
    """The bytes the op must move: (forward, forward+backward).

    Forward reads ``x`` and ``residual`` and writes ``out`` and ``h``: 4·N·D·s. The backward
    reads ``grad_out``, ``grad_h`` and ``h`` and writes ``grad_x`` (``grad_residual`` is the
    same tensor's values: counted once): 4·N·D·s.

    Example:
        >>> bytes_moved(32768, {"D": 5376}, 2)
        (1409286144, 2818572288)
    """
    forward = 4 * n * sizes["D"] * itemsize
    return forward, 2 * forward


BYTES_NOTE = ("forward 4·N·D·s (reads `x`, `residual`; writes `out`, `h`); forward+backward "
              "adds 4·N·D·s (reads `grad_out`, `grad_h`, `h`; writes `grad_x`, counted once "
              "for `grad_residual`, which has the same values).")

SPEC = OpSpec(
    name="add_rms_norm",
    formula="h = x + residual; out = RMSNorm(h) (eps = 1e-6)",
    sizes=("D",),
    inputs={"x": ("N", "D"), "residual": ("N", "D"), "weight": ("D",),
            "grad_out": ("N", "D"), "grad_h": ("N", "D")},
    index=None,
    groups=None,
    upstream="grad_out",
    upstreams={"out": "grad_out", "h": "grad_h"},
    outputs={"out": Output("out", ("N", "D")),
             "h": Output("h", ("N", "D")),
             "x": Output("grad_x", ("N", "D"), grad_of="x"),
             "residual": Output("grad_residual", ("N", "D"), grad_of="residual"),
             "weight": Output("grad_weight", ("D",), grad_of="weight")},
    zero_rows=("x", "residual", "grad_out"),  # h = 0 and grad_out = 0: exact zeros
    bitwise=(),
    implementations_module="gate_residual_matrix.ops.add_rms_norm.implementations",
    implementation_names=(
        "eager", "eager_functional", "numba", "fp64", "compiled", "compiled_emulate",
        "liger_fused_add_rms_norm_llama", "liger_fused_add_rms_norm_gemma",
        "liger_fused_add_rms_norm_none", "vllm_fused_add_rms_norm_cuda"),
    bytes_moved=bytes_moved,
    cell_prefix="add_rms_norm-",
    library_distributions=("liger-kernel", "vllm"),
    notes=(BYTES_NOTE,),
    library_modules={"liger-kernel": ("liger_kernel.ops.fused_add_rms_norm",)},
)
