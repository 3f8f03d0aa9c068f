"""The project's committed reports for tests: never the working tree's ``reports/`` folder.

``nox -s matrix`` and ``nox -s report`` rewrite ``reports/`` in place, so a test that read it
would pass or fail depending on what ran before it. Tests read instead:

* :data:`COMMITTED` (``tests/data/committed``): byte-for-byte copies of committed reports,
  kept as they are when ``reports/`` is regenerated: :data:`HOST_PLAIN_CPU` (made at an older
  commit: a ``--case`` run against it is refused), the H200 ``host-plain-cuda.json`` and
  ``host-deterministic-cuda.json``, and :data:`REFERENCE`, the reference report;
* :func:`committed_reports`: every report ``reports/`` holds at ``HEAD`` (``git show``), copied
  into a folder of the test's own; on a tree without git, the fixtures above.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "tests" / "data" / "committed"
HOST_PLAIN_CPU = COMMITTED / "host-plain-cpu.json"
REFERENCE = COMMITTED / "reference" / "gate_residual_b200.json"


def _git(*args: str) -> subprocess.CompletedProcess[bytes] | None:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done if done.returncode == 0 else None


def committed_reports(dest: Path) -> Path:
    """Copy into ``dest`` (made if missing) the ``*.json`` files of ``reports/`` and
    ``reports/reference/`` at git's ``HEAD``, or, where git or the commit is missing, the
    fixtures of ``tests/data/committed``. Returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    listed = _git("ls-tree", "-r", "--name-only", "HEAD", "--", "reports")
    names = [n for n in (listed.stdout.decode().splitlines() if listed else [])
             if n.endswith(".json") and n.count("/") <= 2
             and (n.count("/") == 1 or n.startswith("reports/reference/"))]
    shown = {n: _git("show", f"HEAD:{n}") for n in names}
    if names and all(shown.values()):
        for name, done in shown.items():
            target = dest / Path(name).relative_to("reports")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(done.stdout)  # type: ignore[union-attr]
        return dest
    shutil.copytree(COMMITTED, dest, dirs_exist_ok=True)
    return dest
