"""The project is one import package: installed beside PyPI's ``kernels`` (Hugging
Face's kernel hub, a package of that name), both import, each its own.

Makes a fresh virtualenv, installs PyPI's ``kernels`` (with its dependencies: needs a package
index) and this project without its dependencies (only its own modules are imported here),
then imports both in one process. About a minute, most of it pip.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_project_installs_beside_pypis_kernels(tmp_path) -> None:
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    python = env / "bin" / "python"
    for args in (["kernels"], ["--no-deps", str(ROOT)]):
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", *args],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    code = (
        "import json, kernels\n"
        "import gate_residual_matrix.kernels as ours, gate_residual_matrix.kernels.errors as e\n"
        "print(json.dumps({'pypi': kernels.__file__, 'ours': ours.__file__,\n"
        "    'hub': hasattr(kernels, 'get_kernel'), 'error': e.OpInputError.__name__}))"
    )
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout)
    assert "site-packages/kernels/" in found["pypi"] and found["hub"], found
    assert "site-packages/gate_residual_matrix/kernels/" in found["ours"], found
    assert found["error"] == "OpInputError"
    script = env / "bin" / "gate-residual-matrix"
    assert script.is_file()  # [project.scripts]


def test_python_dash_m_runs_the_runner() -> None:
    done = subprocess.run([sys.executable, "-m", "gate_residual_matrix", "compare", "--help"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "BASELINE_DIR" in done.stdout, done.stderr
