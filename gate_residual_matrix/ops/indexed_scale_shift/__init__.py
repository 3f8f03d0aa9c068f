"""indexed_scale_shift: MiniMax-H3 DiT's AdaLN modulation.

    out = x * (1 + scale.index_select(0, index)) + shift.index_select(0, index)

``x``, ``grad_out``: (N, D); ``scale``, ``shift``: (G, D) AdaLN rows; ``index``: (N,)
int64/int32 in [0, G). Gradients: ``x`` = grad_x (``grad_out * (1 + scale[index])``),
``scale`` = grad_scale (per row k, the sum of ``grad_out * x`` over the rows with index k),
``shift`` = grad_shift (the sum of ``grad_out`` over the same rows). Kernels:
``kernels/indexed_scale_shift.py`` (numba.cuda) and ``kernels/indexed_scale_shift_cpu.py``
(its CPU twin); implementations: :mod:`ops.indexed_scale_shift.implementations`.
"""

from __future__ import annotations

from collections.abc import Mapping

from gate_residual_matrix.ops.spec import OpSpec, Output


def bytes_moved(n: int, sizes: Mapping[str, int], itemsize: int) -> tuple[int, int]:
    """The bytes the op must move: (forward, forward+backward).

    Forward reads ``x`` and writes ``out``: 2·N·D·s (``scale``, ``shift`` and ``index``
    ignored, G rows). The backward reads ``grad_out`` and ``x`` and writes ``grad_x``
    (3·N·D·s), reads ``scale`` and writes ``grad_scale`` and ``grad_shift`` (3·G·D·s).
    Counted as gate_residual's (docs/tables.md): each tensor that must move once.

    Example:
        >>> bytes_moved(32768, {"D": 5376, "G": 9}, 2)
        (704643072, 1761897984)
    """
    d, g = sizes["D"], sizes["G"]
    forward = 2 * n * d * itemsize
    return forward, forward + 3 * n * d * itemsize + 3 * g * d * itemsize


BYTES_NOTE = ("forward 2·N·D·s (reads `x`; writes `out`); forward+backward adds 3·N·D·s "
              "(reads `grad_out`, `x`; writes `grad_x`) and 3·G·D·s (reads `scale`; writes "
              "`grad_scale`, `grad_shift`). `scale`/`shift`/`index` reads of the forward "
              "are not counted.")

SPEC = OpSpec(
    name="indexed_scale_shift",
    formula="x * (1 + scale.index_select(0, index)) + shift.index_select(0, index)",
    sizes=("D", "G"),
    inputs={"x": ("N", "D"), "scale": ("G", "D"), "shift": ("G", "D"),
            "grad_out": ("N", "D")},
    index="index",
    groups="G",
    upstream="grad_out",
    outputs={"out": Output("out", ("N", "D")),
             "x": Output("grad_x", ("N", "D"), grad_of="x"),
             "scale": Output("grad_scale", ("G", "D"), grad_of="scale"),
             "shift": Output("grad_shift", ("G", "D"), grad_of="shift")},
    zero_rows=("x", "grad_out"),  # grad_scale sums grad_out * x, grad_shift grad_out
    bitwise=("out", "x"),
    implementations_module="gate_residual_matrix.ops.indexed_scale_shift.implementations",
    implementation_names=(
        "eager", "numba", "fp64", "compiled", "compiled_emulate",
        "sglang_indexed_scale_shift_triton", "vllm_omni_indexed_scale_shift"),
    bytes_moved=bytes_moved,
    cell_prefix="scale_shift-",
    library_distributions=("sglang", "vllm-omni"),
    notes=(BYTES_NOTE,),
    library_modules={
        "sglang": ("sglang.kernels.ops.diffusion.modulate.indexed_modulation_triton",),
        "vllm-omni": ("vllm_omni.diffusion.layers.indexed_modulation",            # 0.30.0
                      "vllm_omni.diffusion.attention.ops.minimax_h3_modulation")},  # 0.28.0
)
