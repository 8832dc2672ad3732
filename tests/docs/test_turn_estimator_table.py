"""The agents guide's table of ``turn_rloo`` and ``turn_index_norm`` against the exact
values is what ``scripts/turn_estimator_table.py`` measures (the sample of
``tests/core/test_turn_estimators.py``; a few seconds)."""

from pathlib import Path

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def test_agents_page_table_is_the_scripts_output():
    module = load_script("turn_estimator_table")
    page = (ROOT / "docs" / "guides" / "agents.md").read_text()
    assert module.replace_table(page, module.markdown()) == page, (
        "docs/guides/agents.md is out of step; run "
        "python scripts/turn_estimator_table.py --page docs/guides/agents.md")
