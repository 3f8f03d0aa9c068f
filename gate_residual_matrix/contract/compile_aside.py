"""Compiling is CPU work: a cell process lets the shared GPU lock go while it compiles.

Where the cells of one host share a GPU (:mod:`contract.gpu_lock`), a call of an
implementation is one stretch of shared GPU work, and a timing pass that asks for the GPU
waits for every stretch in progress, with every other process standing still meanwhile. A
call that compiles first holds that stretch for seconds of CPU work:

* ``torch.compile`` tracing a frame and building or loading its graph (dynamo's compile,
  and AOTAutograd's lazy backward), and
* Triton building a library's kernel for a new specialisation (``JITFunction._do_compile``
  on a miss of its in-memory cache: the on-disk cache or a real compile);
* inductor building the Triton kernels of a graph's first run (``CachingAutotuner.
  precompile``: every config's kernel compiled or loaded, then loaded on the device; the
  autotuning that follows times kernels on the GPU and keeps the lock);
* our numba kernels compiled or loaded from the cubin cache (``kernels.launch``'s first use of
  a signature).

And what ``torch.compile`` imports as it wraps its first function, which no callback
covers, is imported by :func:`install` itself, before the first case (:data:`COMPILERS`).

:func:`install` hooks each so that the process steps aside for the compile
(:func:`contract.gpu_lock.step_aside`) and takes the lock again before the compiled code
launches (:func:`contract.gpu_lock.step_back`), also when the compile raises (a caller may
catch it and go on: Triton's autotuner skips a config that fails to compile):
dynamo's compile callbacks (``torch._dynamo.callback_handler``, start and end of every
compile, the end in a ``finally``), ``kernels.launch.AROUND_COMPILE`` (ours), and wrappers
around Triton's ``JITFunction._do_compile`` and inductor's ``CachingAutotuner.precompile``
that call the original unchanged (Triton's ``jit_cache_hook`` / ``jit_post_compile_hook``
pair is not used: a compile that raises skips the second). Nested compiles step aside once,
for the outermost.

Only the scheduling changes: the same code compiles and runs, so no bit depends on it. The
report records the seconds stepped aside (``phases.gpu_lock_set_aside``) and which hooks
were in (``environment.compile_aside``).

Example::

    >>> install()  # in a cell process on a shared GPU, before its first case  # doctest: +SKIP
    {'torch.compile': 'dynamo compile callbacks', 'numba': 'kernels.launch.AROUND_COMPILE', ...}
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import threading
from collections.abc import Iterator

from gate_residual_matrix.contract import gpu_lock

_INSTALLED: dict[str, str] = {}
_depth = [0]  # compiles under way in this process (any thread): nested ones step aside once
_depth_lock = threading.Lock()


def _aside(*_args, **_kwargs) -> None:
    """A compile starts: the outermost one steps aside."""
    with _depth_lock:
        _depth[0] += 1
        if _depth[0] == 1:
            gpu_lock.step_aside()


def _back(*_args, **_kwargs) -> None:
    """A compile ends: the outermost one takes the lock again."""
    with _depth_lock:
        _depth[0] = max(_depth[0] - 1, 0)
        if _depth[0] == 0:
            gpu_lock.step_back()


@contextlib.contextmanager
def aside() -> Iterator[None]:
    """A compile (see module): stepped aside from the lock for its duration."""
    _aside()
    try:
        yield
    finally:
        _back()


def install(compilers: bool = True) -> dict[str, str]:
    """Hook the compiles of the module's list, once per process, where the lock is in use
    (``GATE_RESIDUAL_GPU_LOCK``), and with ``compilers`` (a row uses ``torch.compile``)
    import :data:`COMPILERS`: ``{compiler: how}`` for the hooks that are in (what the
    report's ``environment.compile_aside`` records; empty without the lock). Never raises: a
    torch or Triton without a hook runs as before there, holding the lock while it
    compiles."""
    if _INSTALLED or gpu_lock.path() is None:
        return dict(_INSTALLED)
    try:
        from torch._dynamo.callback import callback_handler

        callback_handler.register_start_callback(_aside)
        callback_handler.register_end_callback(_back)
        _INSTALLED["torch.compile"] = "dynamo compile callbacks"
    except Exception:  # a torch without compile callbacks
        pass
    from gate_residual_matrix.kernels import launch

    launch.AROUND_COMPILE.append(aside)
    _INSTALLED["numba"] = "kernels.launch.AROUND_COMPILE"
    for name, hook in (("triton", _install_triton), ("inductor", _install_inductor)):
        try:
            how = hook()
        except Exception:  # a version without what the hook expects
            how = None
        if how:
            _INSTALLED[name] = how
    try:  # what torch.compile imports as it wraps its first function: see COMPILERS
        for module in COMPILERS if compilers else ():
            importlib.import_module(module)
        if compilers:
            _INSTALLED["torch.compile's imports"] = ("before the first case: "
                                                     + ", ".join(COMPILERS))
    except Exception:  # a torch without them: its first compiled call imports what it needs
        pass
    return dict(_INSTALLED)


COMPILERS = ("torch._inductor.compile_fx",)
"""Imported by :func:`install`, before the cell's first case and outside the lock: what
``torch.compile`` imports when it wraps its first function (hundreds of modules, seconds
where the bytecode is not cached). A cell makes that call lazily, in its first compiled
row's first call, inside a stretch of shared GPU work and before any compile callback,
so a timing pass would wait for the import."""


def _install_triton() -> str | None:
    """Wrap Triton's ``JITFunction._do_compile`` (see module), where it has one."""
    from triton.runtime.jit import JITFunction

    return _wrap(JITFunction, "_do_compile", "JITFunction._do_compile wrapped")


def _wrap(owner: type, name: str, how: str) -> str | None:
    """Replace ``owner.name`` by a function that calls it unchanged inside :func:`aside`;
    ``how`` (for the report), or None where ``owner`` has no such function or it is
    wrapped already."""
    original = owner.__dict__.get(name)
    if original is None or getattr(original, "steps_aside", False):
        return None

    @functools.wraps(original)
    def wrapped(self, *args, **kwargs):
        with aside():
            return original(self, *args, **kwargs)

    wrapped.steps_aside = True
    setattr(owner, name, wrapped)
    return how


def _install_inductor() -> str | None:
    """Wrap inductor's ``CachingAutotuner.precompile`` (see module), where it has one."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    return _wrap(CachingAutotuner, "precompile", "CachingAutotuner.precompile wrapped")
