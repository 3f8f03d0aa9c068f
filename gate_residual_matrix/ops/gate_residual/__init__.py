"""gate_residual: MiniMax-H3 DiT's gated residual (the project's first op).

    out = residual + gate.index_select(0, index) * y

``residual``, ``y``, ``grad_out``: (N, D); ``gate``: (G, D) AdaLN rows; ``index``: (N,)
int64/int32 in [0, G). Gradients: ``res`` = grad_residual (= grad_out), ``y`` = grad_y
(``gate[index] * grad_out``, one rounding), ``gate`` = grad_gate (per gate row, the sum of
``grad_out * y`` over the rows with that index). Kernels: ``kernels/gate_residual.py``
(numba.cuda) and ``kernels/gate_residual_cpu.py`` (its CPU twin); implementations:
:mod:`ops.gate_residual.implementations`.
"""

from __future__ import annotations

from collections.abc import Mapping

from gate_residual_matrix.ops.spec import OpSpec, Output


def bytes_moved(n: int, sizes: Mapping[str, int], itemsize: int) -> tuple[int, int]:
    """The bytes the op must move: (forward, forward+backward).

    Forward reads ``residual`` and ``y`` and writes ``out``: 3·N·D·s (``gate`` and ``index``
    ignored). The backward reads ``grad_out`` and ``y`` and writes ``grad_y`` (3·N·D·s; as in
    autograd ``grad_residual`` is ``grad_out`` itself), reads ``gate`` and writes ``grad_gate``
    (2·G·D·s). Source: docs/tables.md.

    Example:
        >>> bytes_moved(32768, {"D": 5376, "G": 9}, 2)
        (1056964608, 2114122752)
    """
    d, g = sizes["D"], sizes["G"]
    forward = 3 * n * d * itemsize
    return forward, forward + 3 * n * d * itemsize + 2 * g * d * itemsize


BYTES_NOTE = ("forward 3·N·D·s (reads `residual`, `y`; writes `out`); forward+backward adds "
              "3·N·D·s (reads `grad_out`, `y`; writes `grad_y`) and 2·G·D·s (reads `gate`; "
              "writes `grad_gate`). `gate`/`index` reads of the forward are not counted.")

SPEC = OpSpec(
    name="gate_residual",
    formula="residual + gate.index_select(0, index) * y",
    sizes=("D", "G"),
    inputs={"residual": ("N", "D"), "gate": ("G", "D"), "y": ("N", "D"),
            "grad_out": ("N", "D")},
    index="index",
    groups="G",
    upstream="grad_out",
    outputs={"out": Output("out", ("N", "D")),
             "res": Output("grad_res", ("N", "D"), grad_of="residual"),
             "y": Output("grad_y", ("N", "D"), grad_of="y"),
             "gate": Output("grad_gate", ("G", "D"), grad_of="gate")},
    zero_rows=("y", "grad_out"),
    bitwise=("out", "res", "y"),
    implementations_module="gate_residual_matrix.ops.gate_residual.implementations",
    implementation_names=(
        "eager", "numba", "fp64", "compiled", "compiled_emulate",
        "sglang_indexed_gate_triton", "sglang_indexed_gate_triton_inplace",
        "sglang_residual_gate_add_jit", "vllm_omni_gated_residual", "vllm_omni_h3_fused",
        "rl_kernel_h3"),
    bytes_moved=bytes_moved,
    cell_prefix="",  # its reports predate ops: their ids stay <stack>-<mode>-<target>
    library_distributions=("sglang", "vllm-omni"),
    # RL-Kernel's reference report (reports/reference/gate_residual_b200.json) names the
    # diffusers expression and its own op so
    reference_names={"diffusers": "eager", "rl_kernel": "rl_kernel_h3"},
    notes=(BYTES_NOTE,),
    library_modules={
        "sglang": ("sglang.kernels.ops.diffusion.modulate.indexed_modulation_triton",
                   "sglang.kernels.kda_kernels.residual_gate_add_jit"),
        "vllm-omni": ("vllm_omni.diffusion.layers.indexed_modulation",            # 0.30.0
                      "vllm_omni.diffusion.attention.ops.minimax_h3_modulation")},  # 0.28.0
)
