"""The README's test line passes on a fresh machine: a clean clone, a new virtual
environment, only the [test] extra (scripts/check_readme_test_line.py). Slow and online:
it installs from PyPI and runs the whole suite; select it with -m slow."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check_readme_test_line.py"


def test_the_script_runs_the_readmes_line_verbatim():
    dry = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], capture_output=True,
                         text=True, timeout=60, cwd=REPO)
    assert dry.returncode == 0, dry.stderr
    line = dry.stdout.splitlines()[1].removeprefix("line:  ")
    assert line in (REPO / "README.md").read_text()
    assert line.endswith("pip install -c constraints.txt -e '.[test]' && python -m pytest -q")


@pytest.mark.slow
def test_the_readmes_test_line_passes_in_a_fresh_venv_on_a_clean_clone(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "--keep", str(tmp_path / "clone")],
                         capture_output=True, text=True, timeout=4 * 3600, cwd=REPO)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
