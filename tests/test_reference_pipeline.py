"""The loop reference itself reproduces every recorded legacy case (shared/reference)."""

from __future__ import annotations

import copy

import pytest
import torch

from lightning_adv import PRMAdvantageShapingConfig, RolloutGroup, concat_batch
from tests.reference_cases import actor_config, case_paths, load_case, mismatches
from tests.reference_pipeline import SpecError, reference_advantages

PATHS = case_paths()


def run_reference(case: dict) -> dict:
    trajs = copy.deepcopy(case["trajectories"])
    for t in trajs:
        if t.get("rollout_group") is not None:
            g = t["rollout_group"]
            t["rollout_group"] = RolloutGroup(tuple(g["row_counts"]), tuple(g["rewards"]))
    call = case["call"]
    prm = PRMAdvantageShapingConfig(mode=call["advantage_shaping_mode"],
                                    negative_scale=call["gvpo_negative_scale"],
                                    zero_penalty=call["gvpo_zero_penalty"],
                                    zero_eps=call["gvpo_zero_eps"])
    batch, meta = concat_batch(trajs)
    return reference_advantages(batch, meta, actor_config(case), prm)


def test_cases_are_there():
    assert len(PATHS) >= 30, f"expected the recorded cases under {PATHS and PATHS[0].parent}"


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_reference_reproduces_recorded_case(path):
    case = load_case(path)
    expected = case["expected"]
    if "raises" in expected:
        # The legacy code raised; the reference must reject the input too (ActorConfig,
        # RolloutGroup and concat_batch validation count: the spec moves some checks there).
        with pytest.raises((SpecError, ValueError, TypeError, RuntimeError)):
            run_reference(case)
        return
    out = run_reference(case)
    problems = mismatches(out, expected)
    assert not problems, problems
    # the sign-insensitive torch.equal agreement on exact outputs
    for key in ("loss_mask", "is_truncated"):
        assert torch.equal(out[key].to(expected[key].dtype), expected[key]), key
