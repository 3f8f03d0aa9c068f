"""Run every bad input and fault of docs/reliability.md and print what each produced.

Usage::

    python scripts/reliability_table.py > /tmp/tables.md     # about a minute, CPU only

Nothing here is made up: each row comes from running the case now. The bad matrices are
tests/test_config.py's list, each written to a file and given to ``python -m gate_residual_matrix
matrix`` (``runner.__main__.main``, in this process); the bad options are tests/test_cli.py's; the
faults are tests/data/faults.yaml run by the real command line (cell processes and all,
``GATE_RESIDUAL_FAULTS=1``); the op inputs are tests/test_op_input.py's, given to the CPU
entry points and to eager; the kill -9 figures come from tests/test_interrupted.py's harness.
Prints Markdown sections, one table each.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ.pop("GATE_RESIDUAL_FAULTS", None)

import yaml  # noqa: E402

from gate_residual_matrix.runner.__main__ import main  # noqa: E402

FAULTS = ROOT / "tests" / "data" / "faults.yaml"
# The project state the fault runs report, pinned so that edits to this checkout while the
# script runs do not change fingerprints between its runs (see "Re-runs").
PINNED = {"GATE_RESIDUAL_COMMIT": "0123456789abcdef0123456789abcdef01234567"}


def cell(text: object, limit: int = 160) -> str:
    """A Markdown table cell: one line, pipes escaped, long text cut."""
    s = str(text).replace("\n", "\\n").replace("\r", "\\r").replace("\0", "\\0")
    s = s if len(s) <= limit else s[: limit - 1] + "…"
    return s.replace("|", "\\|")


def table(headers: list[str], rows: list[list[object]], limit: int = 160) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(c, limit) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def snapshot(directory: Path) -> dict | None:
    if not directory.exists():
        return None
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in directory.rglob("*")
            if p.is_file()}


def run_main(argv: list[str], reports: Path) -> tuple[int, str, str]:
    """Exit code, the stderr line, and whether ``reports`` changed."""
    before = snapshot(reports)
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(argv)
    changed = "unchanged" if snapshot(reports) == before else "CHANGED"
    return code, err.getvalue().strip(), changed


def bad_config_rows(tmp: Path) -> list[list[object]]:
    from test_config import BAD, Whole, shipped

    rows = []
    reports = tmp / "config-reports"
    reports.mkdir()
    (reports / "keep.json").write_text("{}\n")
    for name, change, _, _ in BAD:
        data = shipped()
        result = change(data)
        data = result.data if isinstance(result, Whole) else data
        path = tmp / "matrix.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=False))
        code, err, changed = run_main(["matrix", "--matrix", str(path), "--reports",
                                       str(reports)], reports)
        rows.append([name, code, changed, err.replace(str(path), "matrix.yaml")])
    return rows


def bad_option_rows(tmp: Path) -> list[list[object]]:
    from test_cli import BAD_OPTIONS

    reports = tmp / "option-reports"
    reports.mkdir()
    (reports / "keep.json").write_text("{}\n")
    rows = []
    big = tmp / "big.yaml"
    big.write_text((ROOT / "matrix.yaml").read_text().replace("  - {n: 4097}",
                                                             "  - {n: 100000000000}", 1))
    extra = [("cuda requested, no GPU on this host", ["--target", "cuda"]),
             ("reports directory did not exist", ["--stack", "nope"]),
             ("a case of N = 10**11 (cases[2] of big.yaml)", ["--matrix", str(big)])]
    for name, argv, *_ in [*BAD_OPTIONS, *extra]:
        where = tmp / "absent" if name.startswith("reports directory") else reports
        code, err, changed = run_main(["matrix", "--reports", str(where), *argv], where)
        if where != reports:
            changed = "not created" if not where.exists() else "CREATED"
        rows.append([name, " ".join(argv).replace(str(tmp) + "/", ""), code, changed, err])
    return rows


def fault_rows(tmp: Path) -> tuple[list[list[object]], str]:
    from gate_residual_matrix.runner.reports.store import read_report

    reports = tmp / "fault-reports"
    env = {**os.environ, "GATE_RESIDUAL_FAULTS": "1", **PINNED}
    argv = [sys.executable, "-m", "gate_residual_matrix.runner", "matrix", "--matrix", str(FAULTS),
            "--reports",
            str(reports), "--target", "cpu", "--timeout", "15"]
    for mode in ("raise", "hang", "oom", "kill", "illegal", "plain"):
        argv += ["--mode", mode]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    rows = []
    for mode, fault in (("raise", "raise"), ("hang", "hang"), ("oom", "oom"),
                        ("kill", "kill"), ("illegal", "illegal_address (cpu target)"),
                        ("plain", "none (after the failing cells)")):
        data = read_report(reports / f"host-{mode}-cpu.json").data
        tail = (data.get("log_tail") or "").strip().splitlines()
        rows.append([fault, data["status"], data["exit_code"], data["reason"],
                     tail[-1] if tail else ""])
    summary = f"exit code {done.returncode}; stderr: `{done.stderr.strip().splitlines()[-1]}`"
    return rows, summary


def interruption_rows(tmp: Path) -> list[list[object]]:
    """SIGINT and SIGTERM to the runner while a cell hangs: exit code, the cell process,
    what is left in the reports directory besides a report that was there before."""
    kept = ROOT / "tests" / "data" / "reports" / "host-plain-cuda.json"
    env = {**os.environ, "GATE_RESIDUAL_FAULTS": "1"}
    rows = []
    for signum, what in ((signal.SIGINT, "SIGINT (Ctrl-C)"), (signal.SIGTERM, "SIGTERM")):
        reports = tmp / f"interrupt-{signum}"
        reports.mkdir()
        (reports / kept.name).write_bytes(kept.read_bytes())
        parent = subprocess.Popen(
            [sys.executable, "-m", "gate_residual_matrix.runner", "matrix", "--matrix", str(FAULTS),
             "--reports",
             str(reports), "--target", "cpu", "--mode", "hang"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        children: list[int] = []
        while not children:
            time.sleep(0.05)
            text = Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text()
            children = [int(p) for p in text.split()]
        time.sleep(2)
        parent.send_signal(signum)
        _, err = parent.communicate()
        try:
            os.kill(children[0], 0)
            alive = "still running"
        except ProcessLookupError:
            alive = "gone"
        others = sorted(p.name for p in reports.iterdir() if p.name != kept.name)
        same = (reports / kept.name).read_bytes() == kept.read_bytes()
        rows.append([f"{what} to the runner while a cell hangs", parent.returncode,
                     f"cell process {alive}",
                     ("earlier report unchanged" if same else "earlier report CHANGED")
                     + ("; nothing else" if not others else f"; also {', '.join(others)}"),
                     err.strip().splitlines()[-1]])
    return rows


def kill_rows(tmp: Path) -> list[list[object]]:
    from test_interrupted import kill_while_writing

    rows = []
    for mode, kills in (("atomic", 30), ("naive", 10)):
        d = tmp / f"kill-{mode}"
        d.mkdir()
        o = kill_while_writing(d, mode, kills=kills, seed=20261129)
        writer = ("runner.reports.store.write_report (temp file, fsync, rename)" if mode == "atomic"
                  else "control: plain open(path, 'w').write")
        rows.append([writer, o.kills, o.advanced, len(o.torn), len(o.wrong), o.temp_files,
                     o.torn[0] if o.torn else "none"])
    return rows


def op_rows() -> list[list[object]]:
    import torch
    from test_op_input import BAD, BAD_BACKWARD, _t, good

    from gate_residual_matrix.kernels.gate_residual_cpu import (
        gate_residual_backward_cpu,
        gate_residual_cpu,
    )

    rows = []
    for name, change, _, _ in BAD:
        x = good("cpu")
        change(x)
        try:
            gate_residual_cpu(x["residual"], x["gate"], x["y"], x["index"])
            ours = "accepted"
        except Exception as err:
            ours = f"{type(err).__name__}: {err}"
        try:
            x["residual"] + x["gate"].index_select(0, x["index"]) * x["y"]
            eager = "computes"
        except Exception as err:
            eager = f"{type(err).__name__}: {str(err).splitlines()[0]}"
        rows.append(["forward", name, ours, eager])
    for name, change, _ in BAD_BACKWARD:
        x = good("cpu")
        x["grad_out"] = _t((4, 8))
        change(x)
        try:
            gate_residual_backward_cpu(x["grad_out"], x["gate"], x["y"], x["index"])
            ours = "accepted"
        except Exception as err:
            ours = f"{type(err).__name__}: {err}"
        rows.append(["backward", name, ours, "(autograd never passes it)"])
    del torch
    return rows


def accepted_rows() -> list[list[object]]:
    """Layouts and values eager accepts: do we give eager's bits? (seed 20261129)."""
    from conftest import inputs
    from test_op_input import LAYOUTS, _views, eager, ours

    rows = []
    for dtype in ("bfloat16", "float16", "float32"):
        x = inputs(37, 24, 3, dtype, "int64", 20261129)
        for how in LAYOUTS:
            v = _views(x, how)
            args = [v[k] for k in ("residual", "gate", "y", "index", "grad_out")]
            want, got = eager(*args), ours("cpu", *args)
            same = all(_same(got[k], want[k]) for k in ("out", "res", "y"))
            rows.append([how, dtype, "yes" if same else "NO"])
    return rows


def security_rows() -> list[list[object]]:
    """One row per kind of string field: how many of the evil values it refused, and the
    message for two of them."""
    from test_security import EVIL, RICH, RICH_SLOTS, _parse, _set

    from gate_residual_matrix.runner.errors import ConfigError

    rows, seen = [], set()
    for slot in RICH_SLOTS:
        if slot.rule in seen:
            continue
        seen.add(slot.rule)
        refused, shown = 0, {}
        for evil in EVIL:
            data = copy.deepcopy(RICH)
            _set(data, slot, evil)
            try:
                _parse(data)
                shown.setdefault(evil, "accepted")
            except ConfigError as err:
                refused += 1
                shown[evil] = str(err)
        where = ".".join(map(str, slot.path)) + (" (key)" if slot.kind == "key" else "")
        rows.append([where, f"{refused} of {len(EVIL)}", shown["x; rm -rf /"],
                     shown["../../etc/passwd"]])
    return rows


def rerun_rows(tmp: Path) -> list[list[object]]:
    """Runs over the fault run's reports: which cells ran again, and why."""
    reports = tmp / "fault-reports"
    env = {**os.environ, "GATE_RESIDUAL_FAULTS": "1", **PINNED}
    rows = []
    for what, extra in (("run again: plain (ok) and raise (error)", ["--mode", "plain",
                                                                     "--mode", "raise"]),
                        ("--force: plain", ["--mode", "plain", "--force"]),
                        ("project commit changed: plain", ["--mode", "plain"])):
        run_env = dict(env)
        if what.startswith("project"):
            run_env["GATE_RESIDUAL_COMMIT"] = "1" * 40
        done = subprocess.run([sys.executable, "-m", "gate_residual_matrix.runner", "matrix",
                               "--matrix",
                               str(FAULTS), "--reports", str(reports), "--target", "cpu",
                               *extra], cwd=ROOT, env=run_env, capture_output=True, text=True)
        ran = [line.split()[2].rstrip(":") for line in done.stdout.splitlines()
               if line.startswith("[runner] cell ")]
        summary = "; ".join(" ".join(line.split()[:3]) for line in done.stdout.splitlines()
                            if line.startswith("host-"))
        rows.append([what, ", ".join(ran) or "none", summary, done.returncode])
    return rows


def partial_rows(tmp: Path) -> list[list[object]]:
    """Partial runs (``--case``) over one cell's report: merged, reused, refused, replaced."""
    from gate_residual_matrix.runner.reports.store import read_report

    data = yaml.safe_load(FAULTS.read_text())
    data["cases"] = [{"n": 5}, {"n": 7}]
    matrix = tmp / "two-cases.yaml"
    matrix.write_text(yaml.safe_dump(data, sort_keys=False))
    reports = tmp / "partial-reports"
    path = reports / "host-plain-cpu.json"
    rows = []
    for what, extra, commit in (
            ("every case", [], None),
            ("--case 7 (current)", ["--case", "7"], None),
            ("--case 7 --force", ["--case", "7", "--force"], None),
            ("--case 5, project commit changed", ["--case", "5"], "1" * 40),
            ("--case 5 --force, project commit changed", ["--case", "5", "--force"], "1" * 40)):
        env = {**os.environ, "GATE_RESIDUAL_FAULTS": "1", **PINNED,
               **({"GATE_RESIDUAL_COMMIT": commit} if commit else {})}
        before = path.read_bytes() if path.exists() else None
        done = subprocess.run([sys.executable, "-m", "gate_residual_matrix.runner", "matrix",
                               "--matrix", str(matrix),
                               "--reports", str(reports), "--target", "cpu", "--mode", "plain",
                               *extra], cwd=ROOT, env=env, capture_output=True, text=True)
        ran = any(line.startswith("[runner] cell host-plain-cpu: running")
                  for line in done.stdout.splitlines())
        line = next((x for x in done.stdout.splitlines() if x.startswith("host-plain-cpu")), "")
        report = read_report(path).data
        runs = (report["environment"].get("case_runs") or {})
        cases = ", ".join(f"{c} ({runs[str(c)]['run_id'][:6]})" if str(c) in runs else str(c)
                          for c in report["cases"])
        rows.append([what, "yes" if ran else "no", " ".join(line.split()),
                     ("unchanged" if path.read_bytes() == before else "written")
                     + f": cases {cases}", done.returncode])
    return rows


def docker_auto_rows(tmp: Path) -> list[list[object]]:
    """Docker stacks this host cannot make, under --backend auto and docker (needs an engine;
    nothing is pulled or built: the base image and the wheelhouse are absent)."""
    from gate_residual_matrix.runner.backends.docker.cells import DockerBackend

    why = DockerBackend().available()
    if why:
        return [["(no engine)", "—", "—", why, "—"]]
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    cpu = data["stacks"]["cpu-torch2.13"]
    data.update(cases=[{"n": 1}], targets=["cpu"], modes={"plain": {}},
                implementations=["eager", "numba", "fp64"])
    data.pop("batch_invariance", None)
    data["stacks"] = {"nobase": {**cpu, "base_image": "gate-residual/absent:never-made",
                                 "pip": {}},
                      "nowheels": {**cpu, "pip": {"find_links": str(tmp / "no-wheels")}}}
    matrix = tmp / "docker.yaml"
    matrix.write_text(yaml.safe_dump(data, sort_keys=False))
    rows = []
    for backend in ("auto", "docker"):
        reports = tmp / f"docker-{backend}"
        done = subprocess.run([sys.executable, "-m", "gate_residual_matrix.runner", "matrix",
                               "--matrix", str(matrix),
                               "--reports", str(reports), "--backend", backend],
                              cwd=ROOT, capture_output=True, text=True)
        for stack in ("nobase", "nowheels"):
            line = next(x for x in done.stdout.splitlines() if x.startswith(f"{stack}-"))
            status = line.split()[1]
            reason = " ".join(line.split()[2:]).replace(str(tmp), "<tmp>")
            rows.append([f"--backend {backend}", stack, status, reason, done.returncode])
    return rows


def report_rows(tmp: Path) -> list[list[object]]:
    """``python -m gate_residual_matrix report`` on a missing directory, a file, good and
    bad reports."""
    good = tmp / "report-good"
    good.mkdir()
    (good / "host-plain-cuda.json").write_bytes(
        (ROOT / "tests" / "data" / "reports" / "host-plain-cuda.json").read_bytes())
    bad = tmp / "report-bad"
    bad.mkdir()
    for name in ("host-plain-cuda.json", "truncated.json", "corrupt.json", "newer.json"):
        (bad / name).write_bytes((ROOT / "tests" / "data" / "reports" / name).read_bytes())
    rows = []
    for what, where in (("a missing directory", tmp / "nonexistent"),
                        ("a file, not a directory", good / "host-plain-cuda.json"),
                        ("readable reports only", good),
                        ("one good, three bad report files", bad)):
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(["report", "--reports", str(where)])
        written = "yes" if (where / "README.md").exists() else "no"
        lines = [x.replace(str(tmp), "<tmp>") for x in err.getvalue().strip().splitlines()]
        rows.append([what, code, written, " / ".join(lines) or "(nothing)"])
    return rows


def _same(a, b) -> bool:
    import torch

    from gate_residual_matrix.contract.compare import bits

    nan = torch.isnan(a) & torch.isnan(b)
    return bool(((bits(a) == bits(b)) | nan).all())


def main_() -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        print("### Bad matrix.yaml (tests/test_config.py's list)\n")
        print(table(["mistake", "exit", "reports dir", "message"], bad_config_rows(tmp)))
        print("\n### Bad command-line options\n")
        print(table(["option", "argv", "exit", "reports dir", "message"],
                    bad_option_rows(tmp)))
        print("\n### Faults (tests/data/faults.yaml, one run)\n")
        rows, summary = fault_rows(tmp)
        print(table(["GATE_RESIDUAL_FAULT", "status", "cell exit code", "reason",
                     "last line of log_tail"], rows, limit=400))
        print(f"\nThe run: {summary}\n")
        print(table(["interruption", "exit", "cell process", "reports directory", "message"],
                    interruption_rows(tmp)))
        print("\n### Re-runs over those reports\n")
        print(table(["run", "cells that ran", "summary", "exit"], rerun_rows(tmp)))
        print("\n### Partial runs (--case) over one cell's report (cases 5 and 7)\n")
        print(table(["run", "ran", "summary", "report (cases, run id)", "exit"],
                    partial_rows(tmp), limit=400))
        print("\n### Docker stacks this host cannot make\n")
        print(table(["run", "stack", "status", "reason", "exit"], docker_auto_rows(tmp),
                    limit=400))
        print("\n### The report command\n")
        print(table(["--reports", "exit", "tables written", "stderr"], report_rows(tmp),
                    limit=600))
        print("\n### kill -9 while writing reports\n")
        print(table(["writer", "kills", "kills after a newer report", "torn files read",
                     "wrong content", "temp files left", "first problem seen"],
                    kill_rows(tmp)))
        print("\n### Bad op input (CPU entry points; eager on the same input)\n")
        print(table(["entry", "input", "ours", "eager"], op_rows()))
        print("\n### Inputs eager accepts in other layouts (CPU; out, grad_res, grad_y)\n")
        print(table(["layout", "dtype", "eager's bits"], accepted_rows()))
        print("\n### Shell metacharacters, newlines, NUL and traversal in every string field\n")
        print(table(["field (first of its kind)", "refused", 'message for "x; rm -rf /"',
                     'message for "../../etc/passwd"'], security_rows()))


if __name__ == "__main__":
    main_()
