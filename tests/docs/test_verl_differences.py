"""The verl guide's table of differences from verl 0.9.1 is what
``scripts/verl_differences.py`` measures with verl's released estimators (the batches of
``tests/integrations/test_verl_estimators.py``; a few seconds)."""

from pathlib import Path

import pytest

from tests.support.peers import VERL_CORE_ALGOS, peer_module
from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.peers
def test_verl_page_table_is_the_scripts_output():
    peer_module(*VERL_CORE_ALGOS)  # (skips without verl, or fails where CI requires peers)
    module = load_script("verl_differences")
    page = (ROOT / "docs" / "guides" / "verl.md").read_text()
    assert module.replace_table(page, module.markdown()) == page, (
        "docs/guides/verl.md is out of step; run "
        "python scripts/verl_differences.py --page docs/guides/verl.md")
