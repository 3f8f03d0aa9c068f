"""rms_norm_scale_shift: MiniMax-H3 DiT's RMSNorm followed by the indexed AdaLN modulation.

    out = RMSNorm(x) * (1 + scale.index_select(0, index)) + shift.index_select(0, index)

with ``RMSNorm(x) = x * rsqrt(mean(x ** 2, -1) + eps) * weight`` (eps = 1e-6). ``x``,
``grad_out``: (N, D); ``weight``: (D,); ``scale``, ``shift``: (G, D) AdaLN rows; ``index``:
(N,) int64/int32 in [0, G). Gradients: grad_x (through the norm's row reduction),
grad_weight (a sum over every row), grad_scale and grad_shift (sums over the rows with
``index == k``). Kernels: ``kernels/rms_norm*.py``; implementations:
:mod:`ops.rms_norm_scale_shift.implementations`.
"""

from __future__ import annotations

from collections.abc import Mapping

from gate_residual_matrix.ops.rms_norm import EPS
from gate_residual_matrix.ops.spec import OpSpec, Output

__all__ = ["EPS", "SPEC", "bytes_moved"]


def bytes_moved(n: int, sizes: Mapping[str, int], itemsize: int) -> tuple[int, int]:
    """The bytes the op must move: (forward, forward+backward).

    Forward reads ``x`` and writes ``out``: 2·N·D·s. The backward reads ``grad_out`` and
    ``x`` and writes ``grad_x`` (3·N·D·s), reads ``scale`` and writes ``grad_scale`` and
    ``grad_shift`` (3·G·D·s); ``weight`` and ``grad_weight`` (D elements) are not counted.

    Example:
        >>> bytes_moved(32768, {"D": 5376, "G": 9}, 2)
        (704643072, 1761897984)
    """
    d, g = sizes["D"], sizes["G"]
    forward = 2 * n * d * itemsize
    return forward, forward + 3 * n * d * itemsize + 3 * g * d * itemsize


BYTES_NOTE = ("forward 2·N·D·s (reads `x`; writes `out`); forward+backward adds 3·N·D·s "
              "(reads `grad_out`, `x`; writes `grad_x`) and 3·G·D·s (reads `scale`; writes "
              "`grad_scale`, `grad_shift`). `weight`, `scale`/`shift` reads of the forward "
              "and `index` are not counted.")

SPEC = OpSpec(
    name="rms_norm_scale_shift",
    formula=("RMSNorm(x) * (1 + scale.index_select(0, index)) + shift.index_select(0, index) "
             "(eps = 1e-6)"),
    sizes=("D", "G"),
    inputs={"x": ("N", "D"), "weight": ("D",), "scale": ("G", "D"), "shift": ("G", "D"),
            "grad_out": ("N", "D")},
    index="index",
    groups="G",
    upstream="grad_out",
    outputs={"out": Output("out", ("N", "D")),
             "x": Output("grad_x", ("N", "D"), grad_of="x"),
             "weight": Output("grad_weight", ("D",), grad_of="weight"),
             "scale": Output("grad_scale", ("G", "D"), grad_of="scale"),
             "shift": Output("grad_shift", ("G", "D"), grad_of="shift")},
    zero_rows=("x", "grad_out"),  # a special in x times a zeroed grad_out would be NaN
    bitwise=(),
    implementations_module="gate_residual_matrix.ops.rms_norm_scale_shift.implementations",
    implementation_names=(
        "eager", "eager_functional", "numba", "fp64", "compiled", "compiled_emulate",
        "liger_modulated_rms_norm_llama", "liger_modulated_rms_norm_gemma",
        "liger_modulated_rms_norm_none", "vllm_omni_rms_norm_scale_shift",
        "vllm_omni_h3_fused_modulated"),
    bytes_moved=bytes_moved,
    cell_prefix="rms_norm_scale_shift-",
    library_distributions=("liger-kernel", "vllm-omni"),
    notes=(BYTES_NOTE,),
    library_modules={
        "liger-kernel": ("liger_kernel.ops.modulated_rms_norm",),
        "vllm-omni": ("vllm_omni.diffusion.layers.indexed_modulation",            # 0.30.0
                      "vllm_omni.diffusion.attention.ops.minimax_h3_modulation")},  # 0.28.0
)
