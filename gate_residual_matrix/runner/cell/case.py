"""One case of a cell: every implementation's runs, hashes, comparisons, timings and batch
invariance, written into the cell's report (:func:`run_case`; :mod:`runner.cell.run` loops over
the cases).

The accuracy reference runs first, then the baseline, then the others in the matrix's order.
Each implementation is compared with the baseline (bit for bit) and with the reference
(error figures) as soon as it has run, and its outputs are dropped after that unless they
are the baseline's or the reference's: a case holds at most three implementations' outputs
at a time. The sha256 of inputs and outputs are computed by worker threads (hashlib releases
the GIL) while the next implementation runs; the case waits for them at its end.

Every implementation's timing loops come after the case's checks, back to back, with the GPU
to this cell alone (:mod:`contract.gpu_lock`): at the case's end, or, where other processes
share the GPU, in one pass after the cell's last case (:mod:`runner.cell.timing_pass`). Every
other stretch of GPU work holds the shared lock, so cells of other modes, and other shards
of this cell (:mod:`runner.backends.shards`), may run beside this one. The stretches are
short (one call and its checks), so a cell waiting to time waits for about one call of each
other cell.
"""

from __future__ import annotations

import concurrent.futures as futures
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from gate_residual_matrix.contract import compare, gpu_budget, gpu_lock
from gate_residual_matrix.contract.base import Implementation
from gate_residual_matrix.contract.row_blocks import RowBlocks
from gate_residual_matrix.runner.cell import batch_invariance, timing_pass
from gate_residual_matrix.runner.cell.heartbeat import Heartbeat
from gate_residual_matrix.runner.cell.phases import PhaseClock
from gate_residual_matrix.runner.status import Status

if TYPE_CHECKING:
    from gate_residual_matrix.ops.spec import OpSpec
    from gate_residual_matrix.runner.config.matrix import Matrix


def changed_inputs(before: dict, after: dict) -> list[str]:
    """Names of the inputs whose bits differ between ``before`` and ``after`` (a call's
    clones after it returned); NaN payloads and the sign of zero count."""
    return [k for k, v in before.items()
            if k in after and not torch.equal(compare.bits(v), compare.bits(after[k]))]


def call(impl: Implementation, inputs: dict, *, backward: bool, inference: bool = False,
         outputs: tuple[str, ...] | None = None):
    """One call on fresh clones: (outputs, detached; names of mutated inputs).

    ``inference``: forward only, under ``torch.inference_mode()``. ``outputs``: the op's
    output keys (:attr:`ops.spec.OpSpec.outputs`) kept of what the call returns (None: all).
    """
    clones = {k: v.clone() for k, v in inputs.items()}
    if inference:
        with torch.inference_mode():
            got = impl.run(clones, backward=False)
    else:
        got = impl.run(clones, backward=backward)
    changed = changed_inputs(inputs, clones)
    kept = {k: v for k, v in got.items() if outputs is None or k in outputs}
    return ({k: _own(v, inputs, clones, changed) for k, v in kept.items()}, changed)


def _own(value, inputs: dict, clones: dict, changed: list[str]):
    """An output of :func:`call`, detached. A :class:`~contract.row_blocks.RowBlocks` whose
    inputs are the call's clones (the same storage, shape, strides and dtype) reads
    ``inputs`` instead when no clone changed (the same bits: :func:`changed_inputs` just
    compared them), so the clones are freed with the call."""
    if not isinstance(value, RowBlocks):
        return value.detach()
    if changed or not all(k in clones and _same_tensor(t, clones[k])
                          for k, t in value.inputs.items()):
        return value
    return value.reading({k: inputs[k] for k in value.inputs})


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` is ``b`` or a view of all of it (detach, alias)."""
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype and a.device == b.device)


def run_repeats(impl: Implementation, inputs: dict, repeats: int, inference: bool = False,
                outputs: tuple[str, ...] | None = None):
    """First run's outputs, per tensor whether every repeat had the same bits, and the
    inputs any call changed (in order of first change). Each repeat is compared with the
    first and dropped at once. ``outputs`` as :func:`call` takes it."""
    backward = impl.has_backward and not inference
    with gpu_lock.shared():  # each call with its checks: one stretch of shared GPU work
        first, mutated = call(impl, inputs, backward=backward, inference=inference,
                              outputs=outputs)
    same = {k: True for k in first}
    for _ in range(repeats - 1):
        with gpu_lock.shared():
            again, changed = call(impl, inputs, backward=backward, inference=inference,
                                  outputs=outputs)
            mutated += [k for k in changed if k not in mutated]
            for k in first:
                same[k] = same[k] and torch.equal(compare.bits(first[k]),
                                                  compare.bits(again[k]))
            del again
    return first, same, mutated


def layout(tensors: dict, fn, spec, *, out_list: bool = True) -> dict:
    """``{<forward>: [fn(<forward>)], "grads": {<grad>: ..., ...}}`` for the tensors present,
    in the order of op ``spec``'s outputs (each forward output is a list in the reference
    report's comparisons, an object elsewhere; an op with two forward outputs has two such
    keys, e.g. ``out`` and ``h``)."""
    entry = {fwd: [fn(fwd)] if out_list else fn(fwd) for fwd in spec.forwards if fwd in tensors}
    grads = {k: fn(k) for k in spec.grads if k in tensors}
    if grads:
        entry["grads"] = grads
    return entry


def _cmp_of(cmp_entry: dict, name: str) -> dict | None:
    """The comparison of tensor ``name`` in a :func:`layout` entry (a list: the forward)."""
    found = cmp_entry.get(name)
    if isinstance(found, list):
        return found[0]
    return cmp_entry.get("grads", {}).get(name)


def claims_broken(impl: Implementation, cmp_entry: dict, target: str) -> list[str]:
    """Claimed tensors that differ from the baseline. On the CPU target NaN payloads are
    exempt: eager's own bfloat16 NaN bits there depend on the element's position (vectorised
    block or tail), see kernels/*_cpu.py."""
    broken = []
    for name in impl.bitwise_claims:
        cmp = _cmp_of(cmp_entry, name)
        if cmp is None:
            continue
        allowed = cmp["nan_payload_differ"] if target == "cpu" else 0
        if cmp["differ"] > allowed:
            broken.append(name)
    return broken


def one_line(err: BaseException, limit: int = 2000) -> str:
    """``Type: first line of the message``, at most ``limit`` characters (a report's reasons
    are bounded: runner/schema/report.schema.json)."""
    first = (str(err).strip().splitlines() or [""])[0]
    line = f"{type(err).__name__}: {first}" if first else type(err).__name__
    return line if len(line) <= limit else line[:limit - 1] + "…"


def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is an allocator's refusal: CUDA out of memory, :class:`MemoryError`,
    or the CPU allocator's ``RuntimeError: ... can't allocate memory``."""
    return isinstance(err, (torch.cuda.OutOfMemoryError, MemoryError)) or (
        isinstance(err, RuntimeError) and "can't allocate memory" in str(err))


@dataclass
class CaseContext:
    """What every case of one cell shares: the matrix, the cell's target and device, the
    implementations in run order (reference, baseline, the rest), the report's ``results``,
    the phase clock, the hashing threads and whether to time and check batch invariance.
    ``spec``: the op's :class:`ops.spec.OpSpec`. ``broken`` and ``no_baseline`` collect
    broken claims and cases without a baseline."""

    spec: OpSpec
    matrix: Matrix
    target: str
    device: str
    impls: list
    results: dict
    clock: PhaseClock
    hasher: futures.ThreadPoolExecutor
    inference: bool
    with_timings: bool
    deferred: list | None = None
    broken: list = field(default_factory=list)
    no_baseline: list = field(default_factory=list)


def _hash_later(ctx: CaseContext, tensors: dict) -> dict:
    """Futures of ``compare.tensor_sha256`` per tensor (hashed by the worker threads)."""
    return {k: ctx.hasher.submit(compare.tensor_sha256, v) for k, v in tensors.items()}


def _run_one(ctx: CaseContext, impl: Implementation, x, on_device: dict, key: str,
             dtype: str) -> dict | None:
    """Run one implementation on one case: repeats, timings, batch invariance; its first
    outputs, or None (unavailable, unsupported dtype, or it failed: recorded)."""
    entry = ctx.results[impl.name]
    if entry["status"] == Status.UNAVAILABLE:
        return None
    supported = getattr(impl, "dtypes", None)  # an optional Implementation field
    if supported and dtype not in supported:
        entry.setdefault("unsupported", {})[key] = f"takes {', '.join(supported)} only, not {dtype}"
        return None
    is_reference = impl.role == "accuracy_reference"
    repeats = 1 if is_reference else ctx.matrix.repeats
    try:
        inputs = timing_pass.inputs_for(impl, x, on_device)
        with ctx.clock.run(impl.name):
            first, same, mutated = run_repeats(impl, inputs, repeats, ctx.inference,
                                               tuple(ctx.spec.outputs))
        entry["mutated_inputs"][key] = mutated
        bi = ctx.matrix.batch_invariance
        if (bi is not None and (impl.has_backward or bi.forward_only)
                and not ctx.inference and not is_reference):
            with ctx.clock("batch_invariance"):  # it takes the shared lock per call
                entry.setdefault("batch_invariant", {})[key] = batch_invariance.check(
                    impl, inputs, ctx.spec, max_size=bi.max_size, full=first,
                    extra=bi.sizes)
    except Exception as err:  # an implementation's failure is data, not a crash
        _failed(ctx, entry, key, err)
        return None
    entry["repeatable"][key] = same if repeats > 1 else {k: None for k in same}
    return first


def _failed(ctx: CaseContext, entry: dict, key: str, err: BaseException) -> None:
    """Record an implementation's failure on case ``key`` (status ``oom`` or ``error``)."""
    oom = out_of_memory(err)
    entry.update(status=Status.OOM if oom else Status.ERROR, reason=f"case {key}: {one_line(err)}",
                 traceback=traceback.format_exc()[-4000:])
    if oom and ctx.device == "cuda":
        torch.cuda.empty_cache()


def _time_all(ctx: CaseContext, ran: list, x, on_device: dict, key: str) -> None:
    """The timing loops of every implementation that ran on this case, after all of its
    checks (:mod:`runner.cell.timing_pass`): now, or, where ``ctx.deferred`` collects them
    (a GPU shared with other processes), in the cell's one pass after its last case."""
    if not ctx.with_timings or not ran:
        return
    if ctx.deferred is not None:  # the inputs stay on the host; the device copies go now
        ctx.deferred.append(timing_pass.Pending(list(ran), x, None, key))
        return
    time_pending(ctx, [timing_pass.Pending(list(ran), x, on_device, key)])


def time_pending(ctx: CaseContext, cases: list) -> None:
    """:func:`runner.cell.timing_pass.take` of ``cases`` (:class:`~runner.cell.timing_pass.
    Pending`) into the cell's results, a failing implementation recorded as a failing run."""
    mib = gpu_budget.mib_of([t for c in cases for t in c.x.tensors.values()],
                            gpu_budget.TIMING_COPIES) if ctx.device == "cuda" else 0
    with gpu_budget.reserve(mib, "timings"):  # the inputs go back to the device
        timing_pass.take(cases, results=ctx.results, device=ctx.device, matrix=ctx.matrix,
                         inference=ctx.inference, clock=ctx.clock,
                         on_error=lambda entry, key, err: _failed(ctx, entry, key, err))


def _same_bits(cmp_entry: dict, name: str) -> bool:
    """Whether tensor ``name`` of a comparison entry (:func:`layout` of
    :func:`contract.compare.bitwise`) has every bit of the baseline's."""
    cmp = _cmp_of(cmp_entry, name)
    return cmp is not None and cmp["differ"] == 0


def _pair_name(row: str, names: set[str]) -> str | None:
    """The matrix name a result row stands for: itself, or a versioned library row's base
    (``vllm_rms_norm_batch_invariant-0.30.0`` -> ``vllm_rms_norm_batch_invariant``)."""
    if row in names:
        return row
    base = row.rsplit("-", 1)[0]
    return base if base in names else None


def _compare_pairs(ctx: CaseContext, name: str, outputs: dict, kept: dict, key: str) -> None:
    """Compare ``name``'s outputs with those of every implementation it is paired with in
    ``matrix.pairs`` that ran before it on this case (not the baseline: that comparison is
    made anyway), then keep them if a later one pairs with it."""
    pairs = ctx.matrix.pairs
    sides = {n for p in pairs for n in p}
    mine = _pair_name(name, sides)
    if mine is None:
        return
    for other, theirs in kept.items():
        base = _pair_name(other, sides)
        if other == ctx.matrix.baseline or ((mine, base) not in pairs
                                            and (base, mine) not in pairs):
            continue
        common = {k: v for k, v in outputs.items() if k in theirs}
        with ctx.clock("comparisons"), gpu_lock.shared():
            cmp_entry = layout(common, lambda k, a=common, b=theirs: compare.bitwise(a[k], b[k]),
                               ctx.spec)
        ctx.results[name].setdefault(f"vs {other}", {})[key] = cmp_entry
        ctx.results[other].setdefault(f"vs {name}", {})[key] = cmp_entry
    kept[name] = outputs


def run_case(ctx: CaseContext, case, x, key: str, dtype: str) -> None:
    """Run every implementation on one case's inputs ``x`` (:class:`contract.inputs.
    CaseInputs`) and record it under ``key`` in ``ctx.results`` (and the hashes' futures
    resolved before it returns); a ``[cell]`` line every :data:`heartbeat.EVERY_S` says
    which implementation or phase it is in (:class:`heartbeat.Heartbeat`).

    Each implementation is compared with the baseline first. A tensor with every bit of the
    baseline's takes the baseline's sha256 and accuracy figures, which are functions of the
    bits alone (:func:`contract.compare.tensor_sha256`, :func:`contract.compare.accuracy` on the
    same reference): the same figures without hashing or measuring the same bytes twice (at
    N = 32768 a tensor is 352 MB of bf16). Every other tensor is hashed and measured.
    """
    with Heartbeat(f"{ctx.matrix.op} case {key}") as beat:
        _run_case(ctx, x, key, dtype, beat)


def _run_case(ctx: CaseContext, x, key: str, dtype: str, beat: Heartbeat) -> None:
    matrix = ctx.matrix
    with ctx.clock("inputs"), gpu_lock.shared():
        on_device = {k: v.to(ctx.device) for k, v in x.tensors.items()}
    pending: dict[str, dict] = {}
    ran: list = []
    kept: dict[str, dict] = {}  # outputs of the implementations named in matrix.pairs
    ref = base = None
    base_hashes: dict = {}
    base_accuracy: dict = {}
    for impl in ctx.impls:
        beat.doing = impl.name
        gpu_lock.doing(impl.name)  # names the long stretches of shared GPU work
        first = _run_one(ctx, impl, x, on_device, key, dtype)
        if first is None:
            continue
        entry = ctx.results[impl.name]
        if impl.role != "accuracy_reference":
            ran.append(impl)
        if impl.name == matrix.accuracy_reference:
            ref = first
            pending[impl.name] = _hash_later(ctx, first)
            continue
        same: set[str] = set()
        if base is not None and impl.name != matrix.baseline:
            with ctx.clock("comparisons"), gpu_lock.shared():
                cmp_entry = layout(first, lambda k, m=first, b=base: compare.bitwise(m[k], b[k]),
                                   ctx.spec)
            entry.setdefault(f"vs {matrix.baseline}", {})[key] = cmp_entry
            ctx.results[matrix.baseline].setdefault(f"vs {impl.name}", {})[key] = cmp_entry
            ctx.broken += [f"{impl.name}.{t}@{key}"
                           for t in claims_broken(impl, cmp_entry, ctx.target)]
            same = {k for k in first if _same_bits(cmp_entry, k) and k in base_hashes}
        pending[impl.name] = {**_hash_later(ctx, {k: v for k, v in first.items()
                                                   if k not in same}),
                              **{k: base_hashes[k] for k in same}}
        if ref is not None and impl.role != "accuracy_reference":
            with ctx.clock("accuracy"), gpu_lock.shared():
                figures = {k: (dict(base_accuracy[k]) if k in same and k in base_accuracy
                               else compare.accuracy(first[k], ref[k])) for k in first}
            entry["accuracy"][key] = layout(first, figures.__getitem__, ctx.spec, out_list=False)
        if impl.name == matrix.baseline:
            base, base_hashes = first, pending[impl.name]
            base_accuracy = figures if ref is not None else {}
        _compare_pairs(ctx, impl.name, first, kept, key)
        del first
    if base is None:
        ctx.no_baseline.append(key)
    del base, ref, kept
    beat.doing = "timings"
    gpu_lock.doing("timings")
    _time_all(ctx, ran, x, on_device, key)
    beat.doing = "hashing"
    with ctx.clock("hashing"):
        for name, hashes in pending.items():
            ctx.results[name]["sha256"][key] = {k: f.result() for k, f in hashes.items()}
    del on_device, pending
    if ctx.device == "cuda":
        torch.cuda.empty_cache()
