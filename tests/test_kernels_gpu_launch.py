"""How our kernels run on a real GPU, beyond their bits per call (run on the H200): launch
shapes, gate_residual's fused backward and its CUDA-graph capture, the cubin cache across
processes (both indexed ops' kernels), autograd's device thread, and the sha256 of CUDA
tensors the reports record. The kernels' bits against eager and the CPU twins, per op:
tests/test_kernels_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
from conftest import DTYPES, assert_bitwise, inputs

pytestmark = pytest.mark.gpu


def on_gpu(x):
    return {k: v.cuda() for k, v in x.items()}


@pytest.mark.parametrize("dtype", DTYPES)
def test_vector_launch_shapes_do_not_move_bits(dtype, fresh_seed):
    """The grid.y cap changes the launch only: same bits, specials too (N odd: a last step
    with one row)."""
    from gate_residual_matrix.kernels import gate_residual as K

    x = on_gpu(inputs(4099, 5376, 9, dtype, "int64", fresh_seed, specials=True))
    expected = x["residual"] + x["gate"].index_select(0, x["index"]) * x["y"]
    sink = K._flags(expected.device)[1]
    for cap in (1, 7, 2048, 65535):
        out = torch.full_like(expected, 7)
        K._launch_forward(out, x["residual"], x["gate"], x["y"], x["index"], sink,
                          max_grid_y=cap)
        assert_bitwise(out, expected, f"grid.y<={cap}")


_CACHE_PROBE = """
import hashlib, json, torch
import gate_residual_matrix.kernels.indexed_scale_shift as scale_shift_module
from gate_residual_matrix.kernels import gate_residual_plans
from gate_residual_matrix.kernels.gate_residual import gate_residual
from gate_residual_matrix.kernels.indexed_scale_shift import indexed_scale_shift
torch.manual_seed(0)
digest = hashlib.sha256()
for n, d in ((300, 5376), (7, 33)):  # vector kernels, element kernels
    x, r, y, go = (torch.randn(n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    g, s = (torch.randn(9, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    i = torch.randint(0, 9, (n,), device="cuda")
    leaves = [t.clone().requires_grad_() for t in (r, g, y)]
    out = gate_residual(*leaves, i)
    out.backward(go)
    leaves2 = [t.clone().requires_grad_() for t in (x, g, s)]
    out2 = indexed_scale_shift(*leaves2, i)
    out2.backward(go)
    for t in (out, *[v.grad for v in leaves], out2, *[v.grad for v in leaves2]):
        digest.update(t.detach().view(torch.int16).cpu().numpy().tobytes())
launchers = [*gate_residual_plans._LAUNCHERS.values(), *scale_shift_module._LAUNCHERS.values()]
dispatchers = {id(x.dispatcher): x.dispatcher for x in launchers}.values()
compiled = sum(len(d.overloads) for d in dispatchers)
print(json.dumps({"launchers": len(launchers), "compiled": compiled,
                  "sha256": digest.hexdigest()}))
"""


def test_cubin_cache_second_process_compiles_nothing(tmp_path):
    """A process with an empty cubin cache compiles every kernel and stores it; a second
    process loads them all (numba compiles no signature) and gives the same bits, and a
    third with the cache off compiles again and gives the same bits (kernels/cubin_cache.py)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent

    def probe(cache: str) -> dict:
        env = {**os.environ, "GATE_RESIDUAL_CUBIN_CACHE": cache,
               "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, "-c", _CACHE_PROBE], env=env, cwd=root,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    cold = probe(str(tmp_path / "cubin"))
    assert cold["launchers"] > 0 and cold["compiled"] == cold["launchers"]
    assert len(list((tmp_path / "cubin").glob("*.cubin"))) == cold["launchers"]
    warm = probe(str(tmp_path / "cubin"))
    assert warm["compiled"] == 0 and warm["launchers"] == cold["launchers"]
    off = probe("off")
    assert off["compiled"] > 0
    assert cold["sha256"] == warm["sha256"] == off["sha256"]


@pytest.fixture
def fuse_eight(monkeypatch):
    """Backward plans made during the test fuse up to 8 chunks (the default is 1, as measured:
    kernels/gate_residual_kernels.py), so that the tickets' path runs; none survives it."""
    from gate_residual_matrix.kernels import gate_residual as K
    from gate_residual_matrix.kernels import gate_residual_backward_plan as B

    monkeypatch.setattr(B, "FUSED_MAX_CHUNKS", 8)
    K._BACKWARD_PLANS.clear()
    yield
    K._BACKWARD_PLANS.clear()


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_backward_equals_two_launches_and_the_cpu_path(dtype, fresh_seed, fuse_eight):
    """One launch (backward_fused: the last block per column block sums the chunks) gives
    the bits of the chunk kernel then the reduction, and of the CPU twin, from one chunk to
    8 (the plans fuse up to 8 here; by default 1), specials included; each launch leaves
    its tickets at zero."""
    from gate_residual_matrix.kernels import gate_residual as K
    from gate_residual_matrix.kernels import gate_residual_backward_plan as B
    from gate_residual_matrix.kernels.gate_residual_cpu import gate_residual_backward_cpu

    for n in (1, K.CHUNK_ROWS, K.CHUNK_ROWS + 1, 300, K.CHUNK_ROWS * 8):
        x = inputs(n, 5376, 9, dtype, "int64", fresh_seed, specials=True)
        g = on_gpu(x)
        args = (g["grad_out"], g["gate"], g["y"], g["index"])
        grad_y, grad_gate = K.gate_residual_backward(*args)
        plan = K._BACKWARD_PLANS.get(K._key(*args, K.FLAG_ASSERT))
        assert plan.fused is not None, n
        fused, plan.fused = plan.fused, None
        try:
            two = K.gate_residual_backward(*args)
        finally:
            plan.fused = fused
        assert_bitwise(grad_y, two[0], f"grad_y N={n}")
        assert_bitwise(grad_gate, two[1], f"grad_gate N={n}")
        again = K.gate_residual_backward(*args)[1]
        assert_bitwise(again, grad_gate, f"grad_gate repeat N={n}")
        _, cpu = gate_residual_backward_cpu(x["grad_out"], x["gate"], x["y"], x["index"])
        assert_bitwise(grad_gate.cpu(), cpu, f"grad_gate GPU vs CPU path N={n}")
        torch.cuda.synchronize()
        for tickets in B._TICKETS.values():
            assert not tickets.any(), f"tickets left set, N={n}"


def test_fused_backward_under_cuda_graph_capture(fresh_seed, fuse_eight):
    """Under capture the partial sums and the tickets are made per call (the graph replays
    the zeroing): replays give the bits of an eager call, and the kept buffers are not
    baked into the graph (the plans fuse up to 8 chunks here)."""
    from gate_residual_matrix.kernels import gate_residual as K

    x = on_gpu(inputs(300, 5376, 9, "bfloat16", "int64", fresh_seed, specials=True))
    args = (x["grad_out"], x["gate"], x["y"], x["index"])
    expected = K.gate_residual_backward(*args, check_index=False)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        K.gate_residual_backward(*args, check_index=False)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = K.gate_residual_backward(*args, check_index=False)
    for _ in range(3):
        for t in captured:
            t.fill_(7)
        graph.replay()
        torch.cuda.synchronize()
        assert_bitwise(captured[0], expected[0], "grad_y, graph replay")
        assert_bitwise(captured[1], expected[1], "grad_gate, graph replay")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int64])
def test_sha256_of_a_cuda_tensor_is_that_of_its_host_bytes(dtype, monkeypatch, fresh_seed):
    """contract.compare.tensor_sha256 copies a CUDA tensor in pieces through pinned buffers:
    the digest is the one of the whole tensor's bytes on the host, for one piece, several
    (odd last piece), an empty tensor and a non-contiguous view."""
    import hashlib

    from gate_residual_matrix.contract import compare

    monkeypatch.setattr(compare, "_PINNED", {})
    monkeypatch.setattr(compare, "_CHUNK", 1000)  # many pieces, the last one short
    gen = torch.Generator().manual_seed(fresh_seed)
    host = torch.randint(-2**15, 2**15, (37, 129), generator=gen, dtype=torch.int64).to(dtype)
    for t in (host, host[:, ::2], host[:0], host[:1, :3]):
        want = hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy()).hexdigest()
        assert compare.tensor_sha256(t.cuda()) == want == compare.tensor_sha256(t)


AUTOGRAD_FIRST = """
import torch
from gate_residual_matrix.kernels.gate_residual import gate_residual, gate_residual_backward
torch.manual_seed(0)
r, y, go = (torch.randn(1, 5376, device="cuda", dtype=torch.bfloat16) for _ in range(3))
g = torch.randn(9, 5376, device="cuda", dtype=torch.bfloat16)
i = torch.zeros(1, dtype=torch.int64, device="cuda")
gate_residual_backward(go, g, y, i)  # here: the kernel is loaded, autograd's thread needs no numba
torch.cuda.synchronize()
leaves = [t.clone().requires_grad_() for t in (r, g, y)]
grads = torch.autograd.grad(gate_residual(*leaves, i), leaves, go)
eager = [t.clone().requires_grad_() for t in (r, g, y)]
expected = torch.autograd.grad(eager[0] + eager[1].index_select(0, i) * eager[2], eager, go)
print("grad_y equal", torch.equal(grads[2].view(torch.int16), expected[2].view(torch.int16)))
"""


def test_backward_as_the_autograd_threads_first_launch():
    """Autograd's device thread runs our backward; at N = 1 it is that thread's first launch
    and nothing before it bound a CUDA context there (H200 at 6e3cb9c: CUresult 201, when
    the main thread had loaded the kernel before, as here, so that numba never ran in that
    thread). A fresh process, so that no earlier test bound one."""
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-c", AUTOGRAD_FIRST],
                          cwd=Path(__file__).resolve().parent.parent, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "grad_y equal True" in done.stdout
