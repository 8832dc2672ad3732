"""tests/support/peers.py: a peer's file is checked against its pin, a missing peer or
optional extra skips (or fails when LIGHTNING_ADV_REQUIRE_PEERS=1), with the install
command as the reason."""

import pytest

from tests.support.peers import (REQUIRE_ENV, VERL_CORE_ALGOS, TRL_GRPO_TRAINER, extras_imported,
                                 peer_module, require_extra, unavailable)


def test_a_missing_peer_skips_with_the_install_command(monkeypatch):
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="not importable.*install it with"):
        peer_module("verl_not_a_real_module.core", sha256="0" * 64)


def test_a_missing_peer_fails_when_peers_are_required(monkeypatch):
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="LIGHTNING_ADV_REQUIRE_PEERS=1: what is missing fails"):
        peer_module("verl_not_a_real_module.core", sha256="0" * 64)


@pytest.mark.peers
@pytest.mark.parametrize("pin", [VERL_CORE_ALGOS, TRL_GRPO_TRAINER], ids=["verl", "trl"])
def test_a_different_file_fails_naming_it(pin):
    name, sha = pin
    peer_module(name, sha256=sha)  # the pinned release is installed
    with pytest.raises(pytest.fail.Exception, match=r"has sha256 .* but the tests compare"):
        peer_module(name, sha256="0" * 64)


def test_a_missing_extra_skips_or_fails_with_its_install_command(monkeypatch):
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"mkdocs_not_a_module is not importable"):
        require_extra("mkdocs_not_a_module")
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=r"install it with.*REQUIRE_PEERS=1"):
        require_extra("mkdocs_not_a_module")
    with pytest.raises(pytest.fail.Exception, match=r"no browser \(LIGHTNING_ADV_REQUIRE_X=1"):
        monkeypatch.setenv("LIGHTNING_ADV_REQUIRE_X", "1")
        unavailable("no browser", env="LIGHTNING_ADV_REQUIRE_X")
    assert require_extra("pytest") is pytest


def test_the_extras_a_source_imports_are_found():
    source = """import torch
from lightning_adv.integrations.trl import AdvantageGRPOTrainer
    import matplotlib.pyplot as plt
from verl import DataProto
from lightning_adv.integrations.verl import register
from peft import LoraConfig
"""
    assert extras_imported(source) == ["trl", "matplotlib", "verl", "peft"]
    assert extras_imported("from lightning_adv.integrations.trl_advantages import x") == []
    assert extras_imported("import lightning_adv\nfrom mkdocs.config import base") == ["mkdocs"]
