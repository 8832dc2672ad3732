"""tests/support/peers.py: a peer's file is checked against its pin, a missing peer skips
(or fails when LIGHTNING_ADV_REQUIRE_PEERS=1), with the install command as the reason."""

import pytest

from tests.support.peers import REQUIRE_ENV, VERL_CORE_ALGOS, TRL_GRPO_TRAINER, peer_module


def test_a_missing_peer_skips_with_the_install_command(monkeypatch):
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="not importable.*install it with"):
        peer_module("verl_not_a_real_module.core", sha256="0" * 64)


def test_a_missing_peer_fails_when_peers_are_required(monkeypatch):
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="peers are required"):
        peer_module("verl_not_a_real_module.core", sha256="0" * 64)


@pytest.mark.peers
@pytest.mark.parametrize("pin", [VERL_CORE_ALGOS, TRL_GRPO_TRAINER], ids=["verl", "trl"])
def test_a_different_file_fails_naming_it(pin):
    name, sha = pin
    peer_module(name, sha256=sha)  # the pinned release is installed
    with pytest.raises(pytest.fail.Exception, match=r"has sha256 .* but the tests compare"):
        peer_module(name, sha256="0" * 64)
