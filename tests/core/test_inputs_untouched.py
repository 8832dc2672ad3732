"""SPEC §1, §5, §9: inputs are never modified, and concat_batch never aliases its inputs.

For every option combination the strategies produce (and all three metadata situations),
running the module leaves every input tensor as it was (values, dtype, shape and
``_version``, so not even a same-value in-place write happens), the input dict keeps its
keys, and the result is a new dict. Also when the module rejects the input.
"""

from __future__ import annotations

import warnings

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_adv import AdvantageModule, BatchMeta, concat_batch
from tests.support.strategies import (
    actor_configs, divisors, features_for, prm_configs, prompt_dicts, rollout_cases, valid_prm,
    with_group_size)

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def snapshot(mapping) -> dict:
    """Keys (in order) and, per tensor, a clone plus dtype, shape and version counter."""
    state = {"keys": list(mapping.keys()), "tensors": {}}
    for key, value in mapping.items():
        if isinstance(value, torch.Tensor):
            state["tensors"][key] = (value.clone(), value.dtype, tuple(value.shape),
                                     value._version)
    return state


def assert_unchanged(mapping, state, where: str) -> None:
    assert list(mapping.keys()) == state["keys"], f"{where}: keys changed"
    for key, (clone, dtype, shape, version) in state["tensors"].items():
        value = mapping[key]
        assert value.dtype == dtype, f"{where}[{key}]: dtype {dtype} -> {value.dtype}"
        assert tuple(value.shape) == shape, f"{where}[{key}]: shape {shape} -> {tuple(value.shape)}"
        assert torch.equal(value, clone), f"{where}[{key}]: values changed"
        assert value._version == version, f"{where}[{key}]: written in place (_version)"


def run_module_quietly(config, batch, meta, prm):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return AdvantageModule(config)(batch, meta, prm=prm)
        except (ValueError, TypeError, RuntimeError):
            return None  # rejected input: it must still be untouched


@st.composite
def cases_and_meta(draw):
    """A case, the metadata situation, and a group size dividing B (for meta=None)."""
    case = draw(rollout_cases())
    situation = draw(st.sampled_from(["concat", "none", "hand_built"]))
    n_rows = sum(t["attention_mask"].shape[0] for t in case.trajectories)
    return case, situation, draw(st.sampled_from(divisors(n_rows)))


@SETTINGS
@given(data=cases_and_meta())
def test_module_leaves_inputs_untouched(data):
    case, situation, group_size = data
    trajs_before = [snapshot(t) for t in case.trajectories]
    batch, meta = concat_batch(case.trajectories)  # the caller's own per-prompt dicts
    config = case.config
    if situation == "none":
        meta, config = None, with_group_size(config, group_size)
    elif situation == "hand_built":
        meta = BatchMeta(n_trajs=meta.n_trajs, traj_group_sizes=list(meta.traj_group_sizes))
    before = snapshot(batch)
    out = run_module_quietly(config, batch, meta, case.prm)
    assert_unchanged(batch, before, "batch")
    for i, (traj, state) in enumerate(zip(case.trajectories, trajs_before)):
        assert_unchanged(traj, state, f"trajectories[{i}]")
    if out is not None:
        assert out is not batch, "the module must return a new dict"
        assert set(batch) <= set(out), "the result must keep the input keys"


def storages(mapping) -> set[int]:
    return {v.untyped_storage().data_ptr() for v in mapping.values()
            if isinstance(v, torch.Tensor) and v.numel() > 0}


@st.composite
def single_and_multi_prompt(draw):
    config = draw(actor_configs())
    prm = valid_prm(config, draw(st.one_of(st.none(), prm_configs())))
    features = draw(features_for(config, prm))
    n = draw(st.integers(1, 3))
    return config, prm, [draw(prompt_dicts(features)) for _ in range(n)]


@SETTINGS
@given(data=single_and_multi_prompt())
def test_concat_batch_returns_new_tensors(data):
    """SPEC §1: a single dict must still produce new tensors (no aliasing)."""
    config, prm, trajs = data
    states = [snapshot(t) for t in trajs]
    batch, meta = concat_batch(trajs)
    for i, (traj, state) in enumerate(zip(trajs, states)):
        assert_unchanged(traj, state, f"trajectories[{i}] after concat_batch")
        shared = storages(batch) & storages(traj)
        assert not shared, f"concat_batch aliases trajectories[{i}] tensors"
    # writing into the batch, or running the module on it, leaves the caller's tensors alone
    run_module_quietly(config, batch, meta, prm)
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            value.add_(1.0)
    for i, (traj, state) in enumerate(zip(trajs, states)):
        assert_unchanged(traj, state, f"trajectories[{i}] after writing into the batch")
