"""Hypothesis strategies for rollout batches and actor configs (reusable by any test).

The main entry point is :func:`rollout_cases`: a :class:`RolloutCase` holding a list of
per-prompt dicts (fed through ``concat_batch``), an ``ActorConfig`` and an optional
call-time ``PRMAdvantageShapingConfig``, drawn so that the combination is valid input
for the default pipeline:

- 1-3 prompts, 1-6 rows each, each prompt at its own width (so ``concat_batch`` pads);
- rows are ``prompt | generated (| env | generated)* (| env)? | padding``: multi-turn
  loss masks with gaps, rows ending with non-generated tokens, rows with no generated
  token at all, rows that fill the padded width;
- optional ``values``, ``ref_logp``, ``prox_logp``, ``token_rewards``, ``turn_ids`` (-1 off
  the mask, non-decreasing, with gaps, adjacent turns and turns spanning an env gap),
  ``is_truncated``, ``mopd_teacher_logp_sum``; optional junk off the mask;
- float32 / float64 / int64 rewards; optional ``RolloutGroup`` per prompt (explicit
  references or None; rows of a rollout without a reference share one reward);
- any ``ActorConfig`` the default pipeline accepts (norm configs, KL estimator, gamma,
  static or functional lambda, token/turn unit, PRM modes, length penalty, ...).

Numbers are drawn from coarse binary grids (multiples of 1/8) so that float32 and float64
arithmetic agree exactly on sums, and normalization statistics are either exactly zero or
well above their eps. Everything is small (``B <= 18``, ``T <= 20``) to keep tests fast.

Constraints between config and batch that the spec makes errors (turn unit without
``turn_ids``, recompute without ``prox_logp``, non-uniform folded token rewards,
process_weighted rewards outside [0, 1], ...) are respected. One error the strategies
do *not* avoid: under a length penalty the rows of a split rollout without an explicit
reference can end up with different penalized rewards, which the spec makes an error;
a test that needs valid input only can ``assume(not case.may_raise)``.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from hypothesis import strategies as st

from lightning_adv import (
    ActorConfig, AdvantageConfig, BatchMeta, NormConfig, PRMAdvantageShapingConfig,
    RolloutGroup, concat_batch)

# ----------------------------------------------------------------------------------------
# number grids
# ----------------------------------------------------------------------------------------


def grid(lo: float, hi: float, step: float = 0.125) -> list[float]:
    n = round((hi - lo) / step)
    return [lo + i * step for i in range(n + 1)]


REWARD_GRID = grid(-2.0, 2.0, 0.25)
VALUE_GRID = grid(-2.0, 2.0)
LOGP_GRID = grid(-3.0, 0.0)
# a rare very unlikely token: |old - ref| > 10 reaches the KL clamp for every estimator
LOGP_GRID_WIDE = LOGP_GRID + [-12.0]
TOKEN_REWARD_GRID = grid(-1.0, 1.0, 0.25)
UNIT_GRID = grid(0.0, 1.0, 0.25)
JUNK_GRID = [-7.5, -3.25, 3.0, 4.5, 9.0]

LAMBDA_FUNCTIONS = {
    "lightning_adv.constant_gae_lambda": ("value", [0.5, 0.9, 1.0]),
    "lightning_adv.vapo_length_adaptive_gae": ("alpha", [0.05, 0.5, 2.0]),
    "lightning_adv.relative_position_gae_lambda": ("q", [0.5, 0.9, 1.0]),
}

# ----------------------------------------------------------------------------------------
# configs
# ----------------------------------------------------------------------------------------


@st.composite
def norm_configs(draw, group_size: int = 1) -> NormConfig:
    """Any NormConfig: batch/group/None levels, leave-one-out, biased or unbiased std."""
    return NormConfig(
        mean_level=draw(st.sampled_from(["batch", "group", None])),
        mean_leave1out=draw(st.booleans()),
        std_level=draw(st.sampled_from(["batch", "group", None])),
        std_unbiased=draw(st.booleans()),
        eps=draw(st.sampled_from([1e-5, 1e-2])),
        group_size=group_size,
    )


def optional_norm_configs() -> st.SearchStrategy[Optional[NormConfig]]:
    return st.one_of(st.none(), norm_configs())


GVPO_VALUES = {"negative_scale": [0.0, 0.2, 0.5], "zero_penalty": [0.0, 0.1, 0.4],
               "zero_eps": [0.0, 1e-6, 0.05]}


@st.composite
def gvpo_kwargs(draw) -> dict[str, float]:
    """A subset of the GVPO kwargs (unspecified keys keep the call-time values)."""
    names = draw(st.lists(st.sampled_from(sorted(GVPO_VALUES)), unique=True, max_size=3))
    return {name: draw(st.sampled_from(GVPO_VALUES[name])) for name in names}


@st.composite
def prm_configs(draw) -> PRMAdvantageShapingConfig:
    return PRMAdvantageShapingConfig(
        mode=draw(st.sampled_from(["additive", "gvpo", "process_weighted"])),
        negative_scale=draw(st.sampled_from(GVPO_VALUES["negative_scale"])),
        zero_penalty=draw(st.sampled_from(GVPO_VALUES["zero_penalty"])),
        zero_eps=draw(st.sampled_from(GVPO_VALUES["zero_eps"])),
    )


@st.composite
def actor_configs(draw) -> ActorConfig:
    """Any ActorConfig of the default pipeline (built-in stages only)."""
    process = draw(st.sampled_from([None, "auto", "additive", "gvpo", "process_weighted"]))
    process_spec: Any = process
    if process == "gvpo":
        process_spec = {"implementation": "gvpo", "kwargs": draw(gvpo_kwargs())}
    token_rewards_as_adv = draw(st.booleans()) if process not in ("gvpo", "process_weighted") else True
    mask_no_eos = draw(st.booleans()) if process != "process_weighted" else False

    if draw(st.booleans()):
        gae_lambda: Any = draw(st.sampled_from([1.0, 0.95, 0.5, 0.0]))
        lambda_kwargs: dict = {}
    else:
        gae_lambda = draw(st.sampled_from(sorted(LAMBDA_FUNCTIONS)))
        name, choices = LAMBDA_FUNCTIONS[gae_lambda]
        lambda_kwargs = {name: draw(st.sampled_from(choices))}

    overlong = draw(st.booleans())
    return ActorConfig(
        reward_bias=draw(st.sampled_from([0.0, 0.5, -0.5])),
        reward_scaling=draw(st.sampled_from([1.0, 0.5, 2.0])),
        reward_clip=draw(st.sampled_from([20.0, 1.5])),
        reward_norm=draw(optional_norm_configs()),
        adv_norm=draw(optional_norm_configs()),
        kl_ctl=draw(st.sampled_from([0.0, 0.1, 0.25])),
        kl_estimator=draw(st.sampled_from(["k1", "k2", "k3"])),
        discount=draw(st.sampled_from([1.0, 0.9, 0.5])),
        gae_lambda=gae_lambda,
        gae_lambda_kwargs=lambda_kwargs,
        gae_timestep_unit=draw(st.sampled_from(["token", "turn"])),
        mask_no_eos_with_zero=mask_no_eos,
        token_rewards_as_adv=token_rewards_as_adv,
        overlong_reward_penalty=overlong,
        overlong_tokens=draw(st.integers(1, 4)) if overlong else None,
        overlong_penalty_factor=draw(st.sampled_from([0.5, 1.0])) if overlong else None,
        max_new_tokens=draw(st.integers(2, 8)),
        use_decoupled_loss=draw(st.booleans()),
        recompute_logprob=draw(st.booleans()),
        dropped_outcome_reward=draw(st.sampled_from(["warn", "ignore"])),
        advantage=AdvantageConfig(
            outcome_reward_shaping=draw(st.sampled_from([None, "auto", "identity"])),
            estimator=draw(st.sampled_from([None, "auto", "token_gae", "turn_gae"])),
            process_adv_shaping=process_spec,
        ),
    )


def effective_process_mode(config: ActorConfig, prm: Optional[PRMAdvantageShapingConfig]) -> str:
    spec = config.advantage.process_adv_shaping
    if spec is not None and spec.implementation != "auto":
        return spec.implementation
    return prm.mode if prm is not None else "additive"


def valid_prm(config: ActorConfig, prm: Optional[PRMAdvantageShapingConfig]):
    """Downgrade a call-time mode the config cannot run (the spec makes it an error)."""
    if prm is None:
        return None
    mode = effective_process_mode(config, prm)
    if mode in ("gvpo", "process_weighted") and not config.token_rewards_as_adv:
        return dataclasses.replace(prm, mode="additive")
    if mode == "process_weighted" and config.mask_no_eos_with_zero:
        return dataclasses.replace(prm, mode="additive")
    return prm


# ----------------------------------------------------------------------------------------
# batches
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Features:
    """Which optional keys every prompt dict carries, and their dtypes."""

    values: bool
    ref_logp: bool
    prox_logp: bool
    token_rewards: Optional[str]        # None, "direct", "folded" or "unit" ([0, 1])
    token_rewards_dtype: torch.dtype
    turn_ids: bool
    turn_ids_dtype: torch.dtype
    turn_pad: int                       # -1, or 0 as in some legacy batches
    is_truncated: bool
    mopd: bool
    junk: bool                          # random values off the mask
    rewards_dtype: torch.dtype
    attention_dtype: torch.dtype
    loss_mask_dtype: torch.dtype
    rollout_groups: bool


@st.composite
def features_for(draw, config: ActorConfig, prm: Optional[PRMAdvantageShapingConfig]) -> Features:
    needs_turn_ids = config.estimator_unit == "turn"
    needs_prox = config.recompute_logprob and not config.use_decoupled_loss
    token_rewards = None
    if draw(st.booleans()):
        if not config.token_rewards_as_adv:
            token_rewards = "folded"
        elif effective_process_mode(config, prm) == "process_weighted":
            token_rewards = "unit"
        else:
            token_rewards = "direct"
    return Features(
        values=draw(st.booleans()),
        ref_logp=draw(st.booleans()),
        prox_logp=needs_prox or draw(st.booleans()),
        token_rewards=token_rewards,
        token_rewards_dtype=draw(st.sampled_from([torch.float32, torch.float32, torch.float64])),
        turn_ids=needs_turn_ids or draw(st.booleans()),
        turn_ids_dtype=draw(st.sampled_from([torch.int64, torch.int32])),
        turn_pad=draw(st.sampled_from([-1, -1, 0])),
        is_truncated=draw(st.booleans()),
        mopd=draw(st.booleans()),
        junk=draw(st.booleans()),
        rewards_dtype=draw(st.sampled_from([torch.float32, torch.float32, torch.int64,
                                            torch.float64])),
        attention_dtype=draw(st.sampled_from([torch.bool, torch.int64])),
        loss_mask_dtype=draw(st.sampled_from([torch.int32, torch.int64, torch.bool])),
        rollout_groups=draw(st.booleans()),
    )


@st.composite
def row_layouts(draw) -> list[str]:
    """Token kinds of one row: 'p' prompt, 'g' generated, 'e' environment/tool."""
    kinds = ["p"] * draw(st.integers(1, 3))
    n_runs = draw(st.integers(0, 3))
    for i in range(n_runs):
        if i > 0:
            kinds += ["e"] * draw(st.integers(1, 2))
        kinds += ["g"] * draw(st.integers(1, 3))
    if n_runs == 0 or draw(st.integers(0, 3)) == 0:
        kinds += ["e"] * draw(st.integers(0, 2))  # the row ends with non-generated tokens
    return kinds


@st.composite
def turn_id_rows(draw, kinds: list[str], width: int, pad: int) -> list[int]:
    """-1 off generated tokens; a non-decreasing id on them, with gaps, adjacent turns and
    (sometimes) one turn continuing across an environment gap."""
    ids = [-1] * len(kinds) + [pad] * (width - len(kinds))
    current = None
    for t, kind in enumerate(kinds):
        if kind != "g":
            continue
        run_start = t == 0 or kinds[t - 1] != "g"
        if current is None:
            current = draw(st.integers(0, 1))
        elif run_start:
            current += draw(st.sampled_from([1, 1, 2, 0]))  # 0: the turn spans the env gap
        elif draw(st.integers(0, 4)) == 0:
            current += draw(st.sampled_from([1, 2]))          # adjacent turns, no gap
        ids[t] = current
    return ids


def pick(draw, choices: list, n: int) -> list:
    return draw(st.lists(st.sampled_from(choices), min_size=n, max_size=n))


@st.composite
def prompt_dicts(draw, features: Features, max_rows: int = 6) -> dict[str, Any]:
    """One prompt's rows at that prompt's own width, plus an optional rollout group."""
    n = draw(st.integers(1, max_rows))
    layouts = [draw(row_layouts()) for _ in range(n)]
    # width >= 2: the module rejects a batch of width 1 (no room for a generated token)
    width = max([2] + [len(k) for k in layouts]) + draw(st.integers(0, 2))
    junk = features.junk

    attention, loss_mask, logprobs, values, ref, prox, mopd = [], [], [], [], [], [], []
    token_rewards, turn_ids = [], []
    for kinds in layouts:
        L = len(kinds)
        attention.append([1] * L + [0] * (width - L))
        gen = [1 if k == "g" else 0 for k in kinds] + [0] * (width - L)
        loss_mask.append(gen)
        lp = pick(draw, LOGP_GRID_WIDE, width)
        off = pick(draw, JUNK_GRID, width) if junk else [0.0] * width
        logprobs.append([lp[t] if gen[t] else off[t] for t in range(width)])
        v = pick(draw, VALUE_GRID, width)
        values.append([v[t] if t < L else (off[t] if junk else 0.0) for t in range(width)])
        r = pick(draw, LOGP_GRID_WIDE, width)
        ref.append([r[t] if t < L else off[t] for t in range(width)])
        p = pick(draw, LOGP_GRID, width)
        prox.append([p[t] if t < L else off[t] for t in range(width)])
        mopd.append(pick(draw, LOGP_GRID, width))
        ids = draw(turn_id_rows(kinds, width, features.turn_pad))
        turn_ids.append(ids)
        token_rewards.append(draw(token_reward_row(features, gen, ids, off)))

    rewards, group = draw(prompt_rewards(features, n))
    traj: dict[str, Any] = {
        "input_ids": torch.tensor([[(7 * t + 3) % 50 + 1 if a else 0 for t, a in enumerate(row)]
                                   for row in attention], dtype=torch.int64),
        "attention_mask": torch.tensor(attention).to(features.attention_dtype),
        "loss_mask": torch.tensor(loss_mask).to(features.loss_mask_dtype),
        "logprobs": torch.tensor(logprobs, dtype=torch.float32),
        "rewards": rewards,
    }
    if features.values:
        traj["values"] = torch.tensor(values, dtype=torch.float32)
    if features.ref_logp:
        traj["ref_logp"] = torch.tensor(ref, dtype=torch.float32)
    if features.prox_logp:
        traj["prox_logp"] = torch.tensor(prox, dtype=torch.float32)
    if features.turn_ids:
        traj["turn_ids"] = torch.tensor(turn_ids, dtype=features.turn_ids_dtype)
    if features.token_rewards is not None:
        traj["token_rewards"] = torch.tensor(token_rewards, dtype=features.token_rewards_dtype)
    if features.is_truncated:
        traj["is_truncated"] = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    if features.mopd:
        traj["mopd_teacher_logp_sum"] = torch.tensor(mopd, dtype=torch.float32)
    if group is not None:
        traj["rollout_group"] = group
    return traj


@st.composite
def token_reward_row(draw, features: Features, gen: list[int], ids: list[int],
                     off: list[float]) -> list[float]:
    width = len(gen)
    kind = features.token_rewards
    choices = UNIT_GRID if kind == "unit" else TOKEN_REWARD_GRID
    row = pick(draw, choices, width)
    if kind == "folded":
        # uniform within each turn: with turn ids every generated token of one id (masked
        # tokens between them do not end a turn), without them each run of generated tokens
        first: dict[int, float] = {}
        for t in range(width):
            if features.turn_ids and gen[t]:
                row[t] = first.setdefault(ids[t], row[t])
            elif t and gen[t] and gen[t - 1]:
                row[t] = row[t - 1]
    junk_row = off if features.junk else [0.0] * width
    return [row[t] if gen[t] else junk_row[t] for t in range(width)]


@st.composite
def prompt_rewards(draw, features: Features, n: int):
    """Rewards of one prompt's rows and its optional RolloutGroup."""
    if features.rewards_dtype == torch.int64:
        values = draw(st.lists(st.integers(-2, 2), min_size=n, max_size=n))
    else:
        values = pick(draw, REWARD_GRID, n)
    group = None
    if features.rollout_groups and draw(st.integers(0, 2)) > 0:
        counts, left = [], n
        while left:
            c = draw(st.integers(1, left))
            counts.append(c)
            left -= c
        refs: list = []
        if draw(st.booleans()):
            refs = [draw(st.one_of(st.none(), st.sampled_from(REWARD_GRID))) for _ in counts]
        start = 0
        for i, c in enumerate(counts):
            if not refs or refs[i] is None:
                for r in range(start + 1, start + c):
                    values[r] = values[start]  # rows of a rollout without a reference agree
            start += c
        group = RolloutGroup(tuple(counts), tuple(refs))
    return torch.tensor(values, dtype=features.rewards_dtype), group


@dataclass
class RolloutCase:
    """Per-prompt dicts plus the config and call-time PRM config to run them with."""

    trajectories: list[dict[str, Any]]
    config: ActorConfig
    prm: Optional[PRMAdvantageShapingConfig] = None
    features: Optional[Features] = field(default=None, repr=False)

    def batch(self) -> tuple[dict[str, Any], BatchMeta]:
        """A fresh ``concat_batch`` of (copies of) the per-prompt dicts."""
        return concat_batch(copy.deepcopy(self.trajectories))

    @property
    def may_raise(self) -> bool:
        """True when a split rollout without a reference may disagree under the penalty."""
        if not self.config.overlong_reward_penalty or self.config.reward_norm is None:
            return False
        return any(t.get("rollout_group") is not None
                   and any(c > 1 for c in t["rollout_group"].row_counts)
                   for t in self.trajectories)


@st.composite
def rollout_cases(draw, max_prompts: int = 3, max_rows: int = 6) -> RolloutCase:
    """A valid (config, prm, per-prompt dicts) combination for the default pipeline."""
    config = draw(actor_configs())
    prm = valid_prm(config, draw(st.one_of(st.none(), prm_configs())))
    features = draw(features_for(config, prm))
    n_prompts = draw(st.integers(1, max_prompts))
    trajs = [draw(prompt_dicts(features, max_rows)) for _ in range(n_prompts)]
    return RolloutCase(trajs, config, prm, features)


def with_group_size(config: ActorConfig, group_size: int) -> ActorConfig:
    """The same config with ``group_size`` set on both norm configs (for meta=None)."""
    changes = {}
    for key in ("reward_norm", "adv_norm"):
        norm = getattr(config, key)
        if norm is not None:
            changes[key] = dataclasses.replace(norm, group_size=group_size)
    return dataclasses.replace(config, **changes) if changes else config


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
