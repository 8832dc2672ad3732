"""verl 0.9.1's own CPU tests of its algorithms (tests/trainer/ppo/test_core_algos_on_cpu.py
from its wheel, pinned by sha256; scripts/fetch_peer_tests.py unpacks it into .peers/)
still pass with this project's adapters registered in verl's registries."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_adv.integrations.verl import estimator_configs
from lightning_adv.losses.policy_loss_registry import policy_loss_names
from tests.support.peers import REQUIRE_ENV, VERL_CORE_ALGOS, file_sha256, peer_module

ROOT = Path(__file__).resolve().parents[2]
VERL_TESTS = ROOT / ".peers" / "verl_tests" / "test_core_algos_on_cpu.py"
VERL_TESTS_SHA256 = "0a60e917589ab91646989f0a8616f810fea0dc70047d2b8c13914f4977f5569c"


@pytest.mark.peers
def test_verls_cpu_tests_pass_with_the_adapters_registered(tmp_path):
    peer_module(*VERL_CORE_ALGOS)
    if not VERL_TESTS.exists():
        reason = (f"{VERL_TESTS.relative_to(ROOT)} is missing: run python "
                  f"scripts/fetch_peer_tests.py (--wheel <verl-0.9.1 wheel> offline)")
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    assert file_sha256(VERL_TESTS) == VERL_TESTS_SHA256, "not verl 0.9.1's test file"
    # verl's file with its own (empty) pytest config: this project's addopts and conftest
    # stay out; the plugin registers the adapters before collection
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
         str(tmp_path / "pytest.ini"), "--rootdir", str(VERL_TESTS.parent),
         "-p", "tests.integrations.verl_register_plugin", str(VERL_TESTS)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "LIGHTNING_ADV_REGISTERED_FILE": str(tmp_path / "registered.json"),
             "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)})
    tail = result.stdout[-3000:] + result.stderr[-2000:]
    assert result.returncode == 0, tail
    registered = json.loads((tmp_path / "registered.json").read_text())
    assert registered == {"estimators": sorted("la_" + n for n in estimator_configs()),
                          "policy_losses": sorted("la_" + n for n in policy_loss_names())}
    assert " passed" in result.stdout and " failed" not in result.stdout, tail
