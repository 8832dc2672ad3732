"""The README's commands are the ones CI and new users run."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "README.md must start with a bash block holding the two set-up commands"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def test_readme_starts_with_install_run_and_test_commands():
    text = (REPO / "README.md").read_text()
    assert text.index("```bash") < 40, "the commands must be the README's first lines"
    run, test = readme_commands()[:2]
    assert "pip install" in run and "constraints.txt" in run
    assert "pip install" in test and "pytest" in test and ".[test]" in test


def test_ci_runs_the_readme_test_command_verbatim():
    test = readme_commands()[1]
    assert test in (REPO / ".ci" / "run").read_text().splitlines()
