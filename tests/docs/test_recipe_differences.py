"""The peers page's comparison with verl, OpenRLHF and TRL is what the script measures
(the verl rows by verl's released code), and the peers agree with the recipes where the
page says "none"."""

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.support.peers import VERL_CORE_ALGOS, peer_module

ROOT = Path(__file__).resolve().parents[2]


def script():
    peer_module(*VERL_CORE_ALGOS)  # (skips without verl, or fails where CI requires peers)
    spec = importlib.util.spec_from_file_location("recipe_differences",
                                                  ROOT / "scripts" / "recipe_differences.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


@pytest.mark.peers
def test_peers_page_table_is_the_scripts_output():
    page = (ROOT / "docs" / "design" / "peers.md").read_text()
    module = script()
    assert module.replace_table(page, module.markdown()) == page, (
        "docs/design/peers.md is out of step; run "
        "python scripts/recipe_differences.py --page docs/design/peers.md")


@pytest.mark.peers
def test_same_formula_means_float_rounding_only():
    for name, peer, note, gap, _ in script().differences():
        if note.startswith("none"):
            assert gap < 1e-6, (name, peer, gap)
        else:
            assert gap > 0 or "group of one" in note or "by default" in note, (name, peer)
