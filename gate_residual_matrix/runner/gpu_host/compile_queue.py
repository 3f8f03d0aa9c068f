"""One queue of compile workers for every matrix file of a ``modes`` step.

The graphs of a mode are the same work whichever file they belong to, and a worker process
is only bound to its mode (the mode's variables are read at import, its torch settings
applied at start), not to a file. So the compile-ahead (:mod:`runner.gpu_host.ahead`) makes
one **job** per mode: the calls of that mode of every file (:class:`runner.cell.precompile.
ModePlan`), the files in the order given (the longest cells' first, so that their cells can
start first). Each job is one plan file that any number of workers share: a worker claims
the next call (:func:`runner.cell.compile_pool.claim`) until none is left, so no worker sits
idle while another has a long tail, and a job's calls are done in order, file by file.

Two waves, as in :func:`runner.cell.precompile.precompile_modes`: the first mode's job (every
file's ``plain``, whose Triton kernels the other modes' graphs mostly reuse) gets every
worker; once nothing of it is left to claim, freed workers go to the later modes' jobs, to the
one with the most calls left per worker. Workers take no GPU lock: the compile-ahead holds
the lock's compile gate until they are all done.

A file's mode is done once each of its calls is (each worker writes the index of each call
it made): its stamp is left (:func:`runner.cell.precompile.leave_stamp`) and ``on_part(path,
mode, "compiled")`` hears it at once, so its cells may start while the other files still
compile. A call that raises is recorded and the worker goes on; a worker that dies loses the
call it was making. A part is ``"failed: ..."`` as soon as each of its calls is made or lost,
or when the deadline cuts it (its cells compile what is missing themselves: time, never
bits).

Example::

    jobs = make_jobs([(Path("matrix.yaml"), plans)], target="cuda")
    record = run_jobs(jobs, workers=14, timeout_s=300, on_part=print)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from gate_residual_matrix.runner.backends.lifetime import die_with_parent
from gate_residual_matrix.runner.cell import heartbeat

POLL_S = 0.25
"""How often the queue looks at its workers and their finished calls."""
MAX_FAILED = 3
"""Workers of one job that may fail before the job gets no more (a mode whose workers cannot
start would otherwise restart them until the deadline)."""


@dataclass
class Job:
    """One mode's calls over several files (those whose settings for it are the same):
    ``parts`` is ``[(path, ModePlan)]`` in priority order, ``first`` whether it is a first
    wave. After :func:`run_jobs`,
    ``failed`` holds a line per failed worker."""

    mode: str
    torch_settings: dict
    env: dict
    target: str
    first: bool
    parts: list = field(default_factory=list)
    failed: list = field(default_factory=list)

    @property
    def calls(self) -> list[dict]:
        """Every part's items in order, each with its op and sizes."""
        return [{**item, "op": plan.op, "sizes": plan.sizes}
                for _, plan in self.parts for item in plan.items]

    def ranges(self) -> list[tuple[Path, object, range]]:
        """``(path, plan, indices of its calls)`` of each part."""
        out, at = [], 0
        for path, plan in self.parts:
            out.append((path, plan, range(at, at + len(plan.items))))
            at += len(plan.items)
        return out


def make_jobs(files: list[tuple[Path, list]], *, target: str) -> list[Job]:
    """The jobs of ``files`` (``[(path, [ModePlan, ...])]``, in priority order, each file's
    plans in mode order): a file's first plan goes to a first-wave job, the others to
    later-wave jobs; plans of one mode with the same settings share a job. First-wave jobs
    come first."""
    jobs: dict[tuple, Job] = {}
    for path, plans in files:
        for i, plan in enumerate(plans):
            key = (i == 0, plan.mode, json.dumps(plan.torch_settings, sort_keys=True),
                   json.dumps(plan.env, sort_keys=True))
            job = jobs.setdefault(key, Job(plan.mode, plan.torch_settings, plan.env, target,
                                           first=i == 0))
            job.parts.append((Path(path), plan))
    return sorted(jobs.values(), key=lambda j: not j.first)


class _Running:
    """The job files and worker processes of one :func:`run_jobs`. Per job: ``PLAN.json``
    (the calls), ``PLAN.claims`` (the counter), ``PLAN.json.done`` (an index per call made),
    ``PLAN.json.lost`` (an index and the error per call that raised); per worker, the index
    of the call it is making (``worker-N.at``), read when it dies."""

    def __init__(self, jobs: list[Job], tmp: Path) -> None:
        self.jobs, self.procs = jobs, []  # procs: (Popen, job index, stderr path)
        self.plans, self.told = [], set()
        for j, job in enumerate(jobs):
            plan = tmp / f"job-{j}.json"
            plan.write_text(json.dumps({
                "torch": job.torch_settings, "target": job.target, "calls": job.calls,
                "claims": str(tmp / f"job-{j}.claims")}), encoding="utf-8")
            self.plans.append(plan)
        self.totals = [len(job.calls) for job in jobs]
        self.died: list[set[int]] = [set() for _ in jobs]  # calls of workers that died

    def claimed(self, j: int) -> int:
        try:
            text = Path(f"{self.plans[j].with_suffix('')}.claims").read_text().strip()
            return min(int(text or 0), self.totals[j])
        except (OSError, ValueError):
            return 0

    def _lines(self, j: int, suffix: str) -> list[str]:
        """The whole lines (ending in a newline: a half-written one is left out) of one of
        job ``j``'s files."""
        try:
            text = Path(f"{self.plans[j]}{suffix}").read_text(encoding="utf-8")
        except OSError:
            return []
        return text.split("\n")[:-1]

    def done(self, j: int) -> set[int]:
        return {int(line) for line in self._lines(j, ".done") if line.isdigit()}

    def lost(self, j: int) -> dict[int, str]:
        """The calls of job ``j`` that will not be made: those that raised (with the error)
        and those whose worker died while making them."""
        out = {i: "its worker died while making it" for i in self.died[j]}
        for line in self._lines(j, ".lost"):
            index, _, why = line.partition("\t")
            if index.isdigit():
                out[int(index)] = why
        return out

    def alive(self, j: int | None = None) -> int:
        return sum(1 for proc, k, _ in self.procs if proc.poll() is None and j in (None, k))

    def start(self, j: int) -> None:
        job, n = self.jobs[j], len(self.procs)
        env = {"TORCHINDUCTOR_COMPILE_THREADS": "1", **os.environ, **job.env}
        err = self.plans[j].with_name(f"worker-{n}.err")
        with open(err, "w", encoding="utf-8") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gate_residual_matrix.runner.cell.compile_pool",
                 str(self.plans[j]), str(err.with_suffix(".at"))], env=env,
                stdout=subprocess.DEVNULL, stderr=stderr, preexec_fn=die_with_parent)
        self.procs.append((proc, j, err))

    def reap(self) -> None:
        """For each worker that ended with an error: a line in its job's ``failed``, and the
        call it was making counted lost."""
        for proc, j, err in self.procs:
            if proc.poll() not in (None, 0) and not getattr(proc, "_told", False):
                proc._told = True
                lines = err.read_text(encoding="utf-8", errors="replace").strip().splitlines()
                named = [ln for ln in lines if "Error" in ln or "Exception" in ln]
                last = ((named or lines or [""])[-1]).strip()[:200]  # the error, not a hint
                self.jobs[j].failed.append(f"{err.stem}: exit code {proc.returncode}: {last}")
                at = err.with_suffix(".at")
                try:
                    self.died[j].add(int(at.read_text().strip()))
                except (OSError, ValueError):
                    pass  # it died before its first claim

    def next_job(self) -> int | None:
        """The job a free worker should take: a first-wave job with calls left to claim
        (beyond those its running workers are about to take), else, once no first-wave
        call is left to claim, the later job with the most calls left per worker."""
        def left(j: int) -> int:
            if len(self.jobs[j].failed) >= MAX_FAILED:
                return 0
            return self.totals[j] - self.claimed(j) - self.alive(j)

        firsts = [j for j, job in enumerate(self.jobs) if job.first]
        for j in firsts:
            if left(j) > 0:
                return j
        if not all(self.over(j) or self.claimed(j) >= self.totals[j] for j in firsts):
            return None
        later = [j for j, job in enumerate(self.jobs) if not job.first and left(j) > 0]
        return max(later, key=lambda j: left(j) / (self.alive(j) + 1), default=None)

    def over(self, j: int) -> bool:
        """Nothing of job ``j`` is left to claim (or it gets no more workers:
        :data:`MAX_FAILED` of them died) and none of its workers runs."""
        return self.alive(j) == 0 and (self.claimed(j) >= self.totals[j]
                                       or len(self.jobs[j].failed) >= MAX_FAILED)

    def settle(self, j: int, final: bool) -> list[tuple]:
        """The parts of job ``j`` whose outcome is known and not yet told, as ``(path,
        plan, outcome)``: ``"compiled"`` once every call of the part is made; ``"failed:
        ..."`` once every call is made or lost and one is lost, or, with ``final`` (the job
        is over), whatever is missing."""
        job, done, lost = self.jobs[j], self.done(j), self.lost(j)
        out = []
        for path, plan, indices in job.ranges():
            if (j, path) in self.told:
                continue
            missing = [i for i in indices if i not in done]
            if not missing:
                outcome = "compiled"
            elif final or all(i in lost for i in missing):
                whys = list(dict.fromkeys(lost[i] for i in missing if i in lost))
                why = "; ".join(whys + job.failed) or "the deadline came first"
                outcome = f"failed: {len(missing)} of {len(indices)} calls not made ({why})"
                outcome = outcome[:300]
            else:
                continue
            self.told.add((j, path))
            out.append((path, plan, outcome))
        return out

    def kill(self) -> None:
        for proc, _, _ in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc, _, _ in self.procs:
            proc.wait()


def run_jobs(jobs: list[Job], *, workers: int, timeout_s: float, on_part=None,
             on_first_over=None, say=None) -> dict:
    """Run ``jobs`` (:func:`make_jobs`) in at most ``workers`` worker processes at once, for
    at most ``timeout_s``. ``on_part(path, mode, outcome)`` hears each file's mode as soon as
    it is ``"compiled"`` (its stamp left) or, at the end, ``"failed: ..."``;
    ``on_first_over()``, once every first-wave job is over; ``say(line)``, the calls done at
    least every :data:`runner.cell.compile_pool.HEARTBEAT_S`. Returns ``{"workers": started,
    "calls", "seconds", "failed": [lines]}``. Interrupted (Ctrl-C, SIGTERM raised as
    ``KeyboardInterrupt``), it kills its workers and raises again."""
    from gate_residual_matrix.runner.cell.compile_pool import HEARTBEAT_S
    from gate_residual_matrix.runner.cell.precompile import leave_stamp

    started, first_told = time.perf_counter(), False
    with tempfile.TemporaryDirectory(prefix="gate-residual-compile-queue-") as tmp:
        running = _Running(jobs, Path(tmp))
        total = sum(running.totals)

        def tell(j: int, final: bool) -> None:
            for path, plan, outcome in running.settle(j, final):
                if outcome == "compiled":
                    leave_stamp(plan.key, plan.items, {"failed": []})
                if on_part is not None:
                    on_part(path, jobs[j].mode, outcome)

        try:
            while True:
                over = [running.over(j) for j in range(len(jobs))]
                running.reap()  # after over(): a worker that died meanwhile is counted
                for j in range(len(jobs)):
                    tell(j, final=over[j])
                if not first_told and all(over[j] for j, job in enumerate(jobs) if job.first):
                    first_told = True
                    if on_first_over is not None:
                        on_first_over()
                if all(over):
                    break
                if time.perf_counter() - started > timeout_s:
                    running.kill()
                    for j, job in enumerate(jobs):
                        if not over[j]:
                            job.failed.append(f"stopped after {timeout_s:g} s")
                    break
                while running.alive() < workers and (j := running.next_job()) is not None:
                    running.start(j)
                if say is not None and heartbeat.quiet_for() >= HEARTBEAT_S:
                    done = sum(len(running.done(j)) for j in range(len(jobs)))
                    say(f"{done} of {total} calls, {running.alive()} workers, "
                        f"{time.perf_counter() - started:.0f} s")
                    heartbeat.said()
                time.sleep(POLL_S)
        except BaseException:
            running.kill()
            raise
        running.reap()
        for j in range(len(jobs)):
            tell(j, final=True)
        if not first_told and on_first_over is not None:
            on_first_over()
        return {"workers": len(running.procs), "calls": total,
                "seconds": round(time.perf_counter() - started, 3),
                "failed": [line for job in jobs for line in job.failed]}
