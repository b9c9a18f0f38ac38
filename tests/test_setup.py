"""`make setup` (the first step of `make run` and `make test`) says what it is doing, a line per phase:
a first install takes about a minute, which a silent terminal makes look hung."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

STUB = "#!/bin/sh\nexit 0\n"  # stands for pip and npm: the phases are what is checked, not the installs


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_setup_says_each_phase_before_it_runs_and_when_it_is_done(tmp_path):
    venv, tools = tmp_path / "venv", tmp_path / "tools"
    (venv / "bin").mkdir(parents=True)
    tools.mkdir()
    for stub in (venv / "bin" / "pip", venv / "bin" / "python", tools / "npm"):
        stub.write_text(STUB)
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["make", "--no-print-directory", "setup", f"VENV={venv}", f"PYTHON={sys.executable}"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stdout.splitlines() if line.startswith("setup: ")]
    assert [line.split()[1] for line in said] == ["updating", "installing", "installing", "done"], result.stdout
    assert "about a minute" in said[1]
    assert (venv / ".installed").exists()
    assert "pip install" not in result.stdout, "the phases, not the commands"
