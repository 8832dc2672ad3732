"""Published pages show commands as a user types them from the repository root: no
absolute path of the machine that wrote them (an interpreter, a checkout, site-packages),
and the benchmark pages' generator (benchmarks/harness.py) writes none."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:root|work|home|usr|tmp|opt|var|Users)/|site-packages"
                          r"|\b[A-Z]:\\")
PAGES = sorted([*(REPO / "docs").rglob("*.md"), REPO / "README.md", REPO / "CONTRIBUTING.md",
                REPO / "benchmarks" / "README.md"])


def machine_paths(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if MACHINE_PATH.search(line)]


def test_no_page_names_a_path_of_the_machine_that_wrote_it():
    found = {str(p.relative_to(REPO)): machine_paths(p.read_text()) for p in PAGES}
    found = {page: lines for page, lines in found.items() if lines}
    assert not found, f"absolute machine paths in published pages: {found}"


def test_the_pattern_finds_what_it_should_and_nothing_else():
    assert machine_paths("- Command: `/work/main/.venv/bin/python benchmarks/x.py`")
    assert machine_paths("lightning_adv from /root/lightning_adv")
    assert machine_paths("in /usr/lib/python3/site-packages/verl")
    assert not machine_paths("python benchmarks/x.py --page docs/benchmarks/x.md")
    assert not machine_paths("see docs/usr/guide and runs/ppo/version_0/tmp/")


@pytest.fixture()
def harness(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("harness", REPO / "benchmarks" / "harness.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_header_names_the_command_as_typed_from_the_root(harness, monkeypatch):
    script = REPO / "benchmarks" / "learning.py"
    monkeypatch.setattr(sys, "orig_argv", ["/work/x/.venv/bin/python3.11", str(script),
                                           "--page", str(REPO / "docs" / "benchmarks" / "a.md"),
                                           "--seeds", "1"], raising=False)
    assert harness.command_line() == ("python benchmarks/learning.py --page "
                                      "docs/benchmarks/a.md --seeds 1")
    assert harness.shown_path(REPO / "lightning_adv") == "lightning_adv/"
    assert harness.shown_path(REPO) == "this checkout"
    assert harness.tree_note("this checkout", harness.ROOT).startswith(
        "this checkout: the working tree;")
    header = harness.page_header("T", [f"lightning_adv from "
                                       f"{harness.check_package_home(harness.ROOT)}"])
    assert not machine_paths(header), header
