"""What both ops' ``compiled`` rows share: the dynamo limits and inductor settings around
their calls, and whether a compiler is on PATH (``ops/<op>/compiled.py`` say why)."""

from __future__ import annotations

import contextlib

import torch

RECOMPILE_LIMIT = 256
"""Shapes one compiled function may be compiled for; hitting it raises (no silent eager)."""


def settings(emulate: bool):
    """The dynamo recompile limit (raise at it) and, with ``emulate``, inductor's
    ``emulate_precision_casts``, as one context manager."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT,
                                                   fail_on_recompile_limit_hit=True))
    if emulate:
        stack.enter_context(torch._inductor.config.patch(emulate_precision_casts=True))
    return stack


def missing_compiler(target: str) -> str | None:
    """Why torch.compile cannot build on ``target`` here, or None: the C++ compiler inductor
    uses for CPU code (``$CXX``, ``g++``, ``c++``, ``clang++``) or the C compiler Triton
    uses for its GPU launchers (``$CC``, ``cc``, ``gcc``, ``clang``)."""
    import os
    import shutil

    env, names, what = (("CXX", ("g++", "c++", "clang++"), "a C++ compiler for inductor")
                        if target == "cpu" else
                        ("CC", ("cc", "gcc", "clang"), "a C compiler for Triton's launcher"))
    candidates = [os.environ[env]] if os.environ.get(env) else list(names)
    if any(shutil.which(c) for c in candidates):
        return None
    return f"torch.compile needs {what} and none is on PATH ({', '.join(candidates)})"
