"""Compiling is CPU work: a cell process lets the shared GPU lock go while it compiles.

Where the cells of one host share a GPU (:mod:`contract.gpu_lock`), a call of an
implementation is one stretch of shared GPU work, and a timing pass that asks for the GPU
waits for every stretch in progress, with every other process standing still meanwhile. A
call that compiles first holds that stretch for seconds of CPU work:

* ``torch.compile`` tracing a frame and building or loading its graph (dynamo's compile,
  and AOTAutograd's lazy backward), and
* Triton building a library's kernel for a new specialisation (``JITFunction`` on a miss of
  its in-memory cache: the on-disk cache or a real compile).

:func:`install` hooks both so that the process steps aside for the compile
(:func:`contract.gpu_lock.step_aside`) and takes the lock again before the compiled code
launches (:func:`contract.gpu_lock.step_back`), through the hooks each library provides for
it: dynamo's compile callbacks (``torch._dynamo.callback_handler``, start and end of every
compile) and Triton's ``knobs.runtime.jit_cache_hook`` / ``jit_post_compile_hook`` (called
before and after ``JITFunction`` compiles). Hooks already set on Triton's knobs are kept and
called first. A compile that raises skips Triton's post-compile hook; the stretch then ends
without the lock, and its exception ends the call.

Only the scheduling changes: the same code compiles and runs, so no bit depends on it. The
report records the seconds stepped aside (``phases.gpu_lock_set_aside``).

Example::

    >>> install()  # in a cell process on a shared GPU, before its first case  # doctest: +SKIP
    True
"""

from __future__ import annotations

from gate_residual_matrix.contract import gpu_lock

_INSTALLED = [False]


def _aside(*_args, **_kwargs) -> None:
    gpu_lock.step_aside()


def _back(*_args, **_kwargs) -> None:
    gpu_lock.step_back()


def install() -> bool:
    """Hook dynamo's and Triton's compiles (see module), once per process, where the lock is
    in use (``GATE_RESIDUAL_GPU_LOCK``) and torch imports; True when the dynamo hooks are in
    (Triton's are added where Triton imports and has the knobs). Never raises: a torch or
    Triton without the hooks runs as before, holding the lock while it compiles."""
    if _INSTALLED[0] or gpu_lock.path() is None:
        return _INSTALLED[0]
    try:
        from torch._dynamo.callback import callback_handler
    except Exception:  # a torch without compile callbacks
        return False
    callback_handler.register_start_callback(_aside)
    callback_handler.register_end_callback(_back)
    _INSTALLED[0] = True
    _install_triton()
    return True


def _install_triton() -> None:
    """Chain the step aside / back onto Triton's JIT compile hooks, where it has them."""
    try:
        from triton import knobs
    except Exception:  # no Triton, or one without knobs
        return
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_cache_hook"):
        return
    before, after = runtime.jit_cache_hook, runtime.jit_post_compile_hook

    def cache_hook(*args, **kwargs):
        skip = before(*args, **kwargs) if before is not None else None
        if not skip:  # Triton compiles now: its post-compile hook follows
            gpu_lock.step_aside()
        return skip

    def post_compile_hook(*args, **kwargs):
        gpu_lock.step_back()
        return after(*args, **kwargs) if after is not None else None

    runtime.jit_cache_hook = cache_hook
    runtime.jit_post_compile_hook = post_compile_hook
