"""The fused native pass (lightning_adv.fused) against the torch steps it stands for:
the same outputs, warnings and errors on random batches, and the cases it leaves to the
torch steps."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_adv import AdvantageConfig, AdvantageModule, compute_token_gae, fused, native
from lightning_adv.testing.synthetic import module_configs, realistic_inputs
from tests.strategies import RolloutCase, rollout_cases
from tests.test_fused_paths import mask_pairs

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TORCH_ONLY = ("prox_logp", "token_rewards", "mopd_teacher_logp_sum")
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_native_library_is_in_use():
    """CI installs with a C compiler: the loops must be built and loaded there."""
    assert native.available(), native.STATUS


def fused_case(case: RolloutCase) -> RolloutCase:
    """The case with what only the torch steps handle taken out: a token GAE with a
    fixed λ and no prox_logp, token_rewards or MOPD keys."""
    config = case.config
    lam = config.gae_lambda if not isinstance(config.gae_lambda, str) else 0.9
    spec = config.advantage
    config = dataclasses.replace(
        config, gae_lambda=lam, gae_lambda_kwargs={}, gae_timestep_unit="token",
        recompute_logprob=False,
        advantage=AdvantageConfig(outcome_reward_shaping=spec.outcome_reward_shaping,
                                  estimator="token_gae",
                                  process_adv_shaping=spec.process_adv_shaping))
    trajectories = [{k: v for k, v in t.items() if k not in TORCH_ONLY}
                    for t in case.trajectories]
    return RolloutCase(trajectories, config, case.prm, case.features)


def run(module, batch, meta, prm=None):
    """Output (or the exception) and the warnings of one call."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = module(batch, meta, prm=prm)
        except (ValueError, TypeError) as exc:
            out = exc
    return out, [(w.category, str(w.message)) for w in caught]


def assert_same(got, want):
    if isinstance(want, Exception):
        assert type(got) is type(want) and str(got) == str(want), (got, want)
        return
    assert not isinstance(got, Exception), got
    assert got.keys() == want.keys()
    for key, value in want.items():
        if not isinstance(value, torch.Tensor):
            assert got[key] == value, key
            continue
        other = got[key]
        assert other.dtype == value.dtype and other.shape == value.shape, key
        # float32 rounding: the fused pass runs GAE's recurrence sequentially in float64
        # and sums normalization statistics in float64 (the torch steps use rescaled
        # cumulative sums and float32 row sums)
        torch.testing.assert_close(other, value, rtol=2e-6, atol=2e-6, msg=key)


@SETTINGS
@given(case=rollout_cases())
def test_fused_pass_equals_torch_steps(case):
    case = fused_case(case)
    batch, meta = case.batch()
    module = AdvantageModule(case.config)
    assert module._fused_plan is not None
    assert fused.takes(batch, module._fused_plan)
    got, got_warnings = run(module, batch, meta, case.prm)
    with native.disabled():  # (a new module: some warnings are given once per module)
        want, want_warnings = run(AdvantageModule(case.config), batch, meta, case.prm)
    assert_same(got, want)
    assert got_warnings == want_warnings


@st.composite
def corrupted_batches(draw):
    """A valid fused batch with one fault the checks must catch, as the torch path does:
    masks (values, gaps, padding, column 0, NaN), a non-finite float, a log-prob above
    the tolerance where it is read."""
    att, loss = draw(mask_pairs())
    rows, width = att.shape
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    batch = {"input_ids": torch.ones(rows, width, dtype=torch.long),
             "attention_mask": att, "loss_mask": loss,
             "logprobs": -torch.rand(rows, width, generator=gen),
             "values": torch.randn(rows, width, generator=gen),
             "ref_logp": -torch.rand(rows, width, generator=gen),
             "rewards": torch.randn(rows, generator=gen)}
    key = draw(st.sampled_from(["none", "logprobs", "values", "ref_logp"]))
    if key != "none":
        r, t = draw(st.integers(0, rows - 1)), draw(st.integers(0, width - 1))
        batch[key][r, t] = draw(st.sampled_from([float("nan"), float("inf"), -float("inf"),
                                                 0.5, 3.0]))
    return batch


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=corrupted_batches(), action=st.sampled_from(["warn", "raise", "ignore"]))
def test_fused_checks_decide_and_say_what_the_torch_checks_do(batch, action):
    module = AdvantageModule({"positive_ref_prox_logp": action, "kl_ctl": 0.1})
    took = fused.takes(batch, module._fused_plan)
    assert took or batch["attention_mask"].dtype not in native.MASK_KINDS \
        or batch["loss_mask"].dtype not in native.MASK_KINDS
    got, got_warnings = run(module, batch, None)
    with native.disabled():
        want, want_warnings = run(AdvantageModule(module.config), batch, None)
    assert_same(got, want)
    assert got_warnings == want_warnings


@pytest.mark.parametrize("name", ["default", "ppo.yaml", "GRPO"])
def test_benchmarked_configs_take_the_fused_pass(name):
    module = AdvantageModule(module_configs(CONFIGS)[name])
    x = realistic_inputs(16, 64, torch.device("cpu"))
    assert fused.takes(x.batch, module._fused_plan)
    got = module(x.batch, x.meta)
    with native.disabled():
        want = module(x.batch, x.meta)
    assert_same(got, want)


def aligned_of_one_call(module, batch, meta):
    """The AlignedBatch of steps 4-8 in one call of ``module``."""
    seen = []

    def recording(*args):
        aligned, temporal = AdvantageModule.align_and_estimate(module, *args)
        seen.append(aligned)
        return aligned, temporal

    module.align_and_estimate = recording
    module(batch, meta)
    return seen[0]


@pytest.mark.parametrize("truncated", [False, True])
def test_the_fused_aligned_batch_is_the_torch_one(truncated):
    # A subclass reading the aligned batch sees the same fields on both paths (the
    # bootstrap values before truncation zeroes them, as align_batch gives them).
    x = realistic_inputs(8, 48, torch.device("cpu"))
    batch = {**x.batch, "is_truncated": torch.full((8,), truncated)}
    config = module_configs(CONFIGS)["ppo.yaml"]
    got = aligned_of_one_call(AdvantageModule(config), batch, x.meta)
    with native.disabled():
        want = aligned_of_one_call(AdvantageModule(config), batch, x.meta)
    assert got.facts.values_checked and want.facts.values_checked
    for field in dataclasses.fields(want):
        value = getattr(want, field.name)
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(getattr(got, field.name), value, msg=field.name)
        elif field.name != "facts":
            assert getattr(got, field.name) is value is None, field.name
    assert bool(want.bootstrap_values.ne(0).all())


def test_bool_masks_read_any_nonzero_byte_as_true():
    # torch reads a bool byte other than 0 and 1 (a uint8 tensor viewed as bool) as
    # true; the loops do the same instead of calling it a bad mask value.
    x = realistic_inputs(8, 48, torch.device("cpu"))
    att, loss = x.batch["attention_mask"].bool(), x.batch["loss_mask"].bool()
    odd = {**x.batch, "attention_mask": (att.to(torch.uint8) * 2).view(torch.bool),
           "loss_mask": (loss.to(torch.uint8) * 7).view(torch.bool)}
    plain = {**x.batch, "attention_mask": att, "loss_mask": loss}
    module = AdvantageModule(module_configs(CONFIGS)["ppo.yaml"])
    assert fused.takes(odd, module._fused_plan)
    assert_same(module(odd, x.meta), module(plain, x.meta))
    rewards, values = torch.randn(8, 48), torch.randn(8, 48)
    for mask in (odd["loss_mask"], plain["loss_mask"]):
        got = compute_token_gae(rewards, values, mask, bootstrap_values=torch.zeros(8),
                                discount=1.0, gae_lambda=0.95)
        with native.disabled():
            want = compute_token_gae(rewards, values, plain["loss_mask"],
                                     bootstrap_values=torch.zeros(8), discount=1.0,
                                     gae_lambda=0.95)
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)


class OwnEstimate(AdvantageModule):
    def estimate(self, inputs):
        return super().estimate(inputs)


def test_what_the_fused_pass_leaves_to_the_torch_steps():
    x = realistic_inputs(4, 32, torch.device("cpu"))
    plan = AdvantageModule()._fused_plan
    assert fused.takes(x.batch, plan)
    # a subclass replacing a step the pass stands for, a turn-level or functional-λ
    # estimator, an outcome stage reading log-probs before they are checked
    assert OwnEstimate()._fused_plan is None
    assert AdvantageModule({"gae_timestep_unit": "turn"})._fused_plan is None
    assert AdvantageModule({"gae_lambda": "lightning_adv.vapo_length_adaptive_gae",
                            "gae_lambda_kwargs": {"alpha": 0.05}})._fused_plan is None
    assert AdvantageModule({"kl_ctl": 0.0, "advantage": {
        "outcome_reward_shaping": "sequence_kl"}})._fused_plan is None
    # batches with keys only the torch steps read, other dtypes, no explicit truncation
    # flag for truncated_reward
    for key in TORCH_ONLY:
        assert not fused.takes({**x.batch, key: x.batch["logprobs"]}, plan)
    assert not fused.takes({**x.batch, "logprobs": x.batch["logprobs"].double()}, plan)
    assert not fused.takes({**x.batch, "loss_mask": x.batch["loss_mask"].to(torch.int16)}, plan)
    truncating = AdvantageModule({"truncated_reward": {"value": -1.0}})._fused_plan
    assert not fused.takes(x.batch, truncating)
    assert fused.takes({**x.batch, "is_truncated": torch.zeros(4, dtype=torch.bool)}, truncating)
    with native.disabled():
        assert not fused.takes(x.batch, plan)


@pytest.mark.parametrize("config", [{}, {"kl_ctl": 0.0, "values": False}])
def test_torch_defaults_do_not_reach_the_loops(config):
    """The loops read and write float32 CPU memory whatever torch's default dtype is."""
    x = realistic_inputs(4, 32, torch.device("cpu"))
    batch = dict(x.batch)
    if config.pop("values", True) is False:
        del batch["values"]
    module = AdvantageModule(config)
    want = module(batch, x.meta)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        got = AdvantageModule(config)(batch, x.meta)
    finally:
        torch.set_default_dtype(previous)
    assert_same(got, want)
