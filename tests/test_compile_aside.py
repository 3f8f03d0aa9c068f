"""contract/compile_aside.py: a cell lets the shared GPU lock go while it compiles.

Each check runs in a fresh process (the hooks are process-wide) and reports what a probe saw
of the lock file while the compiler ran: free (another process could time) or held.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_PROBE = "from tests.lock_probe import free_for_a_timer as free\n"

_DYNAMO = _PROBE + textwrap.dedent("""
    import json, sys
    import torch
    from torch._dynamo.callback import callback_handler
    from gate_residual_matrix.contract import compile_aside, gpu_lock
    lock, install = sys.argv[1], sys.argv[2] == "1"
    seen = {}
    if install:
        first = compile_aside.install()
        assert first["torch.compile"] and compile_aside.install() == first  # once
    # registered after ours: runs while the compile is under way
    callback_handler.register_start_callback(lambda *_: seen.setdefault("compiling", free(lock)))

    def f(x):
        return torch.sin(x) * 2 + 1

    g = torch.compile(f, backend="eager", dynamic=False)
    with gpu_lock.shared():
        out = g(torch.arange(4.0))
        seen["after"] = free(lock)
    seen["bits"] = torch.equal(out, f(torch.arange(4.0)))
    seen["aside_s"] = gpu_lock.aside_s()
    print(json.dumps(seen))
""")


def _run(script: str, *args: str, lock: Path) -> dict:
    env = {**os.environ, "GATE_RESIDUAL_GPU_LOCK": str(lock), "PYTHONPATH": str(ROOT),
           "TORCHINDUCTOR_CACHE_DIR": str(lock.parent / "inductor")}
    done = subprocess.run([sys.executable, "-c", script, str(lock), *args], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_torch_compile_inside_a_stretch_leaves_the_lock_free_until_it_ends(tmp_path):
    seen = _run(_DYNAMO, "1", lock=tmp_path / "gpu.lock")
    assert seen["compiling"] is True  # another process could have timed meanwhile
    assert seen["after"] is False  # the compiled code ran with the lock taken again
    assert seen["bits"] is True and seen["aside_s"] > 0


def test_without_the_hooks_a_compile_holds_the_lock(tmp_path):
    """The control: the same compile, hooks not installed, keeps the lock throughout."""
    seen = _run(_DYNAMO, "0", lock=tmp_path / "gpu.lock")
    assert seen["compiling"] is False and seen["after"] is False and seen["aside_s"] == 0


_TRITON = _PROBE + textwrap.dedent("""
    import json, sys, types
    import torch._dynamo.callback  # torch first: it probes for a real Triton
    # a stand-in for Triton's JITFunction (no Triton on a CPU machine): _do_compile is where
    # it compiles a kernel on a miss of its in-memory cache, and may raise
    lock = sys.argv[1]
    seen = {}

    class JITFunction:
        def _do_compile(self, key, *rest, fail=False):
            seen.setdefault("compiling", []).append(free(lock))
            if fail:
                raise RuntimeError("ptxas failed")
            return f"kernel {key}"

    jit = types.ModuleType("triton.runtime.jit")
    jit.JITFunction = JITFunction
    runtime = types.ModuleType("triton.runtime")
    runtime.jit = jit
    triton = types.ModuleType("triton")
    triton.runtime = runtime
    sys.modules.update({"triton": triton, "triton.runtime": runtime, "triton.runtime.jit": jit})
    from gate_residual_matrix.contract import compile_aside, gpu_lock
    seen["hooks"] = compile_aside.install()
    with gpu_lock.shared():
        seen["kernel"] = JITFunction()._do_compile("k1")
        seen["after"] = free(lock)
        try:  # a caller that goes on after a failed compile (Triton's autotuner does)
            JITFunction()._do_compile("k2", fail=True)
        except RuntimeError:
            seen["after_failure"] = free(lock)
        JITFunction()._do_compile("k3")  # steps aside again: nothing was left behind
    print(json.dumps(seen))
""")


def test_triton_compiles_step_aside_and_a_failed_one_takes_the_lock_back(tmp_path):
    seen = _run(_TRITON, lock=tmp_path / "gpu.lock")
    assert seen["hooks"]["triton"] == "JITFunction._do_compile wrapped"
    assert seen["kernel"] == "kernel k1"
    assert seen["compiling"] == [True, True, True]
    assert seen["after"] is False and seen["after_failure"] is False


_NESTED = _PROBE + textwrap.dedent("""
    import json, sys, types
    from gate_residual_matrix.contract import compile_aside, gpu_lock
    from gate_residual_matrix.kernels import launch
    lock = sys.argv[1]
    hooks = compile_aside.install()
    seen = {"numba_hook": "numba" in hooks and compile_aside.aside in launch.AROUND_COMPILE}
    with gpu_lock.shared():
        with compile_aside.aside():  # dynamo compiling a graph ...
            with compile_aside.aside():  # ... whose kernels inductor builds
                seen["inner"] = free(lock)
            seen["outer_after_inner"] = free(lock)  # still aside: the outer compile goes on
        seen["after"] = free(lock)
        # a numba kernel's first use: loaded inside AROUND_COMPILE
        launcher = launch.Launcher(dispatcher=None, argtypes=())
        launcher._function = lambda: seen.setdefault("loading", free(lock)) and \\
            types.SimpleNamespace(handle=7)
        seen["handle"] = launcher.handle()
        seen["after_load"] = free(lock)
    print(json.dumps(seen))
""")


def test_nested_compiles_step_aside_once_and_numba_loads_step_aside(tmp_path):
    seen = _run(_NESTED, lock=tmp_path / "gpu.lock")
    assert seen["numba_hook"] is True
    assert seen["inner"] is True and seen["outer_after_inner"] is True
    assert seen["after"] is False
    assert seen["loading"] is True and seen["handle"] == 7 and seen["after_load"] is False


def test_install_imports_what_torch_compile_imports_before_the_first_case(tmp_path):
    """Where the lock is in use, install() imports inductor's compile_fx (what torch.compile
    imports as it wraps its first function), so no compiled row's first call imports it
    inside a stretch; the record says so."""
    code = textwrap.dedent("""
        import sys
        import torch
        from gate_residual_matrix.contract import compile_aside
        before = "torch._inductor.compile_fx" in sys.modules
        hooks = compile_aside.install()
        print(before, "torch._inductor.compile_fx" in sys.modules,
              "torch.compile's imports" in hooks)
    """)
    env = {**os.environ, "GATE_RESIDUAL_GPU_LOCK": str(tmp_path / "gpu.lock"),
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.stdout.split() == ["False", "True", "True"], done.stdout + done.stderr
