"""rms_norm: the RMSNorm of a transformer block (trainer against rollout).

    out = x * rsqrt(mean(x ** 2, -1) + eps) * weight        (eps = 1e-6)

``x``, ``grad_out``: (N, D); ``weight``: (D,). Gradients: ``x`` = grad_x (a row reduction:
``r * (g*w - n * mean(g*w*n))`` with ``n = x * r``), ``weight`` = grad_weight (the sum over
every row of ``grad_out * n``). Unlike gate_residual, the forward itself reduces (the mean of
squares), so two implementations that sum a row in other orders differ in the forward.
Kernels: ``kernels/rms_norm*.py``; implementations: :mod:`ops.rms_norm.implementations`.
"""

from __future__ import annotations

from collections.abc import Mapping

from gate_residual_matrix.ops.spec import OpSpec, Output

EPS = 1e-6
"""The epsilon inside the square root (MiniMax-H3's DiT and vLLM's default)."""


def bytes_moved(n: int, sizes: Mapping[str, int], itemsize: int) -> tuple[int, int]:
    """The bytes the op must move: (forward, forward+backward).

    Forward reads ``x`` and writes ``out``: 2·N·D·s. The backward reads ``grad_out`` and
    ``x`` and writes ``grad_x``: 3·N·D·s (``weight`` and ``grad_weight``, D elements, are not
    counted).

    Example:
        >>> bytes_moved(32768, {"D": 5376}, 2)
        (704643072, 1761607680)
    """
    forward = 2 * n * sizes["D"] * itemsize
    return forward, forward + 3 * n * sizes["D"] * itemsize


BYTES_NOTE = ("forward 2·N·D·s (reads `x`; writes `out`); forward+backward adds 3·N·D·s "
              "(reads `grad_out`, `x`; writes `grad_x`). `weight` and `grad_weight` (D "
              "elements) are not counted.")

SPEC = OpSpec(
    name="rms_norm",
    formula="x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * weight",
    sizes=("D",),
    inputs={"x": ("N", "D"), "weight": ("D",), "grad_out": ("N", "D")},
    index=None,
    groups=None,
    upstream="grad_out",
    outputs={"out": Output("out", ("N", "D")),
             "x": Output("grad_x", ("N", "D"), grad_of="x"),
             "weight": Output("grad_weight", ("D",), grad_of="weight")},
    zero_rows=("x", "grad_out"),  # a zero row of both adds exact zeros to grad_weight
    bitwise=(),
    implementations_module="gate_residual_matrix.ops.rms_norm.implementations",
    implementation_names=(
        "eager", "eager_functional", "numba", "fp64", "compiled", "compiled_emulate",
        "liger_rms_norm_llama", "liger_rms_norm_gemma", "liger_rms_norm_none",
        "vllm_rms_norm_batch_invariant", "vllm_rms_norm_cuda"),
    bytes_moved=bytes_moved,
    cell_prefix="rms_norm-",
    library_distributions=("liger-kernel", "vllm"),
    notes=(BYTES_NOTE,),
    library_modules={
        "liger-kernel": ("liger_kernel.ops.rms_norm",),
        "vllm": ("vllm.model_executor.determinism.batch_invariant",)},
)
