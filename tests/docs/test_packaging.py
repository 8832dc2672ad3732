"""The README is the front door: its first lines are the commands CI and new users run, it
stays short, carries no dated measurement, and its links lead somewhere."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
CI = (REPO / ".ci" / "run").read_text()


def readme_commands() -> list[str]:
    block = re.search(r"```bash[^\n]*\n(.*?)```", README, re.S)
    assert block, "README.md must start with a bash block holding the two set-up commands"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def test_readme_starts_with_install_run_and_test_commands():
    assert README.index("```bash") < 40, "the commands must be the README's first lines"
    run, test = readme_commands()
    assert "pip install -c constraints.txt -e ." in run
    assert run.endswith("python -m lightning_adv fit --config configs/ppo.yaml")
    assert test == ("python3 -m venv .venv && . .venv/bin/activate && pip install -c "
                    "constraints.txt -e '.[test]' && python -m pytest -q")


def test_ci_runs_the_readme_test_command_verbatim_with_the_docs_extra():
    test = readme_commands()[1]
    lines = CI.splitlines()
    assert test in lines
    install = next(i for i, line in enumerate(lines) if "'.[test,docs" in line)
    assert install < lines.index(test), "the docs extra is installed before the tests run"


def test_readme_is_short_and_holds_no_dated_measurement():
    assert len(README.splitlines()) <= 150
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", README), "dates belong on the benchmark pages"
    assert not re.search(r"\b\d+(\.\d+)? ?(s|ms|µs|steps/s|MiB|GiB)\b(?! ?=)", README), (
        "measured times and sizes belong on the benchmark pages")


def test_readme_links_lead_to_files_of_the_repository():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if "://" in target:
            continue
        assert (REPO / target).exists(), target
