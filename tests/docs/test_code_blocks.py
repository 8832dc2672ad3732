"""Every code block of the README and the documentation site runs, or says why not.

Python blocks run page by page, in order, in one fresh process per page (a reader runs
them top to bottom); shell blocks run one by one (slow: most train something). A block
that cannot run carries a ``not run: <reason>`` marker (``tests/support/doc_blocks.py``).
"""

from __future__ import annotations

import pytest

from tests.support.doc_blocks import REPO, blocks, code_blocks, documents, run_python, run_shell, \
    scratch_directory
from tests.support.peers import require_extras_of

PYTHON_PAGES = sorted({b.path for b in code_blocks("python") if b.runs})
SHELL_BLOCKS = [b for b in code_blocks("shell") if b.runs]


def rel(path) -> str:
    return str(path.relative_to(REPO))


def test_every_not_run_marker_gives_a_reason():
    unexplained = [b.where for path in documents() for b in blocks(path)
                   if not b.runs and len(b.reason.split()) < 2]
    assert not unexplained, f"'not run' needs a reason ('not run: needs a GPU'): {unexplained}"


def test_code_blocks_say_their_language():
    """A block without a language would be neither run nor marked."""
    unlabelled = [b.where for path in documents() for b in blocks(path) if not b.language]
    assert not unlabelled, f"label these blocks (python, bash, yaml, text, ...): {unlabelled}"


def test_the_readme_and_the_guides_have_blocks_that_run():
    assert REPO / "README.md" in PYTHON_PAGES
    assert any(rel(p).startswith("docs/getting-started/") for p in PYTHON_PAGES)
    assert any(b.path == REPO / "README.md" for b in SHELL_BLOCKS)


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=rel)
def test_python_blocks_run(page, tmp_path):
    runnable = [b for b in blocks(page) if b.kind == "python" and b.runs]
    # a page of an optional extra (the verl and TRL guides) skips without it, fails in CI
    require_extras_of("\n".join(b.code for b in runnable))
    run = run_python(runnable, scratch_directory(tmp_path))
    assert run.returncode == 0, run.stderr[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: b.where)
def test_shell_blocks_run(block, tmp_path):
    require_extras_of(block.code)
    run = run_shell(block, scratch_directory(tmp_path))
    assert run.returncode == 0, f"{block.where}:\n{block.code}\n{run.stderr[-4000:]}"
