"""The spec pipeline: a slow, loop-by-loop version of the default advantage pipeline (SPEC §3).

Written from ``shared/design/SPEC.md`` (§1-§3, §5, §9) and ``shared/reference/FORMAT.md``
§5, not from the package's code. Everything is a plain Python loop over rows and
positions on Python floats (float64). Only the places where the spec says a value is
*stored* in float32 are rounded to float32 (``f32``): the length penalty, the outcome
score, group statistics, and the final outputs.

The spec pipeline imports nothing from ``lightning_adv`` except the config/meta dataclasses
(to read their fields) and ``GAELambdaContext`` (only to call a user's own lambda
function; the built-in lambda functions are reimplemented below).

``spec_pipeline_advantages(batch, meta, config, prm)`` returns the dict the module must
return. When the spec says the input is an error, it raises :class:`SpecError`.
Pass ``details={}`` to receive intermediate values (used by the tests to bound the
float32 rounding of ill-conditioned normalizations).
"""

from __future__ import annotations

import importlib
import math
import struct
from typing import Any, Optional

import torch

from lightning_adv.config import ActorConfig, NormConfig, PRMAdvantageShapingConfig
from lightning_adv.batch.grouping import BatchMeta


class SpecError(ValueError):
    """The spec says this input must be rejected (the module must raise too)."""


# ----------------------------------------------------------------------------------------
# small helpers
# ----------------------------------------------------------------------------------------

def f32(x: float) -> float:
    """Round a Python float to the nearest float32 value (as storing it in float32 does)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def clip(x: float, bound: float) -> float:
    return min(max(x, -bound), bound)


def as_lists(t: torch.Tensor) -> list:
    return t.detach().cpu().tolist()


def shift_left(row: list) -> list:
    """``torch.roll(row, -1)``: position t gets token t+1; the last column gets column 0."""
    return row[1:] + row[:1]


def tensor_f32(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def present(batch: dict, key: str) -> bool:
    return batch.get(key) is not None


# ----------------------------------------------------------------------------------------
# normalization (SPEC §3 "Normalization")
# ----------------------------------------------------------------------------------------

def norm_statistics(x: list, norm: NormConfig, mask: Optional[list], group_rows: list,
                    member_counts: list) -> tuple[list, list]:
    """Per element mean and std of ``x`` ([rows][cols]) under ``norm``.

    ``group_rows``: for each group, the list of its row indices. ``member_counts``: the
    member count of each group (for the singleton rules). Returns ``(mean, std)`` as
    [rows][cols] lists; ``std`` is None where ``std_level`` is None.
    """
    n_rows, n_cols = len(x), len(x[0])
    m = mask if mask is not None else [[1.0] * n_cols for _ in range(n_rows)]

    def mean_of(rows: list, singleton: bool) -> dict:
        total = sum(m[b][t] * x[b][t] for b in rows for t in range(n_cols))
        count = sum(m[b][t] for b in rows for t in range(n_cols))
        means = {}
        for b in rows:
            for t in range(n_cols):
                if norm.mean_leave1out:
                    if singleton:
                        mu = x[b][t]  # a group of one member uses the element itself
                    elif count <= 1:
                        mu = 0.0
                    elif m[b][t] > 0:
                        mu = (total - x[b][t] * m[b][t]) / max(count - m[b][t], 1)
                    else:
                        mu = total / count
                else:
                    mu = total / count if count > 0 else 0.0
                means[b, t] = mu
        return means

    def std_of(rows: list, singleton: bool, means: dict) -> float:
        if singleton and norm.std_unbiased:
            return 1.0
        ss = sum((m[b][t] * x[b][t] - m[b][t] * means[b, t]) ** 2
                 for b in rows for t in range(n_cols))
        count = sum(m[b][t] for b in rows for t in range(n_cols))
        if norm.std_unbiased:
            return 1.0 if count <= 1 else math.sqrt(ss / (count - 1))
        return 1.0 if count == 0 else math.sqrt(ss / count)

    all_rows = list(range(n_rows))
    means: dict = {}
    if norm.mean_level == "batch":
        means = mean_of(all_rows, singleton=False)
    elif norm.mean_level == "group":
        for rows, members in zip(group_rows, member_counts):
            for key, mu in mean_of(rows, singleton=members == 1).items():
                means[key] = f32(mu)  # group means are stored in float32
    else:
        means = {(b, t): 0.0 for b in all_rows for t in range(n_cols)}

    stds: Optional[dict] = None
    if norm.std_level == "batch":
        s = std_of(all_rows, singleton=False, means=means)
        stds = {(b, t): s for b in all_rows for t in range(n_cols)}
    elif norm.std_level == "group":
        stds = {}
        for rows, members in zip(group_rows, member_counts):
            s = f32(std_of(rows, singleton=members == 1, means=means))  # stored in float32
            for b in rows:
                for t in range(n_cols):
                    stds[b, t] = s

    mean_rows = [[means[b, t] for t in range(n_cols)] for b in all_rows]
    std_rows = None if stds is None else [[stds[b, t] for t in range(n_cols)] for b in all_rows]
    return mean_rows, std_rows


def normalize(x: list, norm: NormConfig, mask: Optional[list], group_rows: list,
              member_counts: list, info: Optional[dict] = None) -> list:
    """``(centered / (std + eps))`` per element, as float64 values of float32 results."""
    n_rows, n_cols = len(x), len(x[0])
    if mask is not None and all(v == 0 for row in mask for v in row):
        if info is not None:
            info["scale"] = [[1.0] * n_cols for _ in range(n_rows)]
        return [[f32(v) for v in row] for row in x]
    mean, std = norm_statistics(x, norm, mask, group_rows, member_counts)
    m = mask if mask is not None else [[1.0] * n_cols for _ in range(n_rows)]
    out, scales = [], []
    for b in range(n_rows):
        out_row, scale_row = [], []
        for t in range(n_cols):
            centered = (x[b][t] - mean[b][t]) * m[b][t]
            scale = 1.0 if std is None else std[b][t] + norm.eps
            out_row.append(centered / scale)
            scale_row.append(scale)
        out.append(out_row)
        scales.append(scale_row)
    if info is not None:
        info["scale"] = scales
    return [[f32(v) for v in row] for row in out]


def slices(sizes: list) -> list:
    """Consecutive row ranges of the given sizes, as lists of row indices."""
    rows, start = [], 0
    for size in sizes:
        rows.append(list(range(start, start + size)))
        start += size
    return rows


def fixed_group_sizes(n_rows: int, group_size: int, key: str) -> list:
    if group_size < 1 or n_rows % group_size != 0:
        raise SpecError(f"{key}: batch of {n_rows} rows is not a multiple of group_size "
                        f"{group_size}")
    return [group_size] * (n_rows // group_size)


# ----------------------------------------------------------------------------------------
# per-row GAE lambda (SPEC §3 step 8, §4)
# ----------------------------------------------------------------------------------------

def builtin_lambda(name: str, length: int, kwargs: dict) -> float:
    if name == "constant_gae_lambda":
        return float(kwargs["value"])
    if name == "vapo_length_adaptive_gae":
        if length == 0:
            return 0.0
        return max(0.0, 1.0 - 1.0 / (float(kwargs["alpha"]) * length))
    if name == "relative_position_gae_lambda":
        if length == 0:
            return 0.0
        if length == 1:
            return 1.0
        return float(kwargs["q"]) ** (1.0 / (length - 1))
    raise KeyError(name)


def row_lambdas(config: ActorConfig, token_lengths: list, turn_counts: list,
                unit: str) -> list:
    """One lambda per row."""
    lam = config.gae_lambda
    n_rows = len(token_lengths)
    if not isinstance(lam, str):
        if not math.isfinite(float(lam)):
            raise SpecError(f"static gae_lambda must be finite, got {lam}")
        return [float(lam)] * n_rows
    lengths = token_lengths if unit == "token" else turn_counts
    module_name, _, fn_name = lam.rpartition(".")
    if module_name == "lightning_adv":
        try:
            values = [builtin_lambda(fn_name, n, config.gae_lambda_kwargs) for n in lengths]
        except KeyError:
            values = None
        if values is not None:
            if not all(math.isfinite(v) and 0 <= v <= 1 for v in values):
                raise SpecError(f"gae_lambda function {lam} returned a value outside [0, 1]")
            return values
    # A user's own lambda function: call it with the documented context.
    from lightning_adv.stages.gae_lambda import GAELambdaContext
    fn = getattr(importlib.import_module(module_name), fn_name)
    context = GAELambdaContext(
        effective_token_lengths=torch.tensor(token_lengths, dtype=torch.int64),
        turn_counts=torch.tensor(turn_counts, dtype=torch.int64),
        timestep_lengths=torch.tensor(lengths, dtype=torch.int64))
    values = [float(v) for v in fn(context, **config.gae_lambda_kwargs).tolist()]
    if not all(math.isfinite(v) and 0 <= v <= 1 for v in values):
        raise SpecError(f"gae_lambda function {lam} returned a value outside [0, 1]")
    return values


# ----------------------------------------------------------------------------------------
# the pipeline
# ----------------------------------------------------------------------------------------

def process_mode(config: ActorConfig, prm: Optional[PRMAdvantageShapingConfig]) -> tuple[str, dict]:
    """The process shaping that runs, and its GVPO values (SPEC §2 "Legacy PRM selection")."""
    spec = config.advantage.process_adv_shaping
    legacy = prm if prm is not None else PRMAdvantageShapingConfig()
    gvpo = {"negative_scale": legacy.negative_scale, "zero_penalty": legacy.zero_penalty,
            "zero_eps": legacy.zero_eps}
    if spec is not None and spec.implementation != "auto":
        mode = spec.implementation
        if mode == "gvpo":
            gvpo.update(spec.kwargs)  # explicit kwargs override the call-time values key by key
    else:
        mode = prm.mode if prm is not None else "additive"
    return mode, gvpo


def estimator_unit(config: ActorConfig) -> str:
    spec = config.advantage.estimator
    if spec is None or spec.implementation == "auto":
        return config.gae_timestep_unit
    if spec.implementation == "token_gae":
        return "token"
    if spec.implementation == "turn_gae":
        return "turn"
    raise NotImplementedError(f"the spec pipeline covers the built-in estimators only, got {spec}")


def spec_pipeline_advantages(batch: dict, meta: Optional[BatchMeta] = None,
                         config: Optional[ActorConfig] = None,
                         prm: Optional[PRMAdvantageShapingConfig] = None,
                         details: Optional[dict] = None) -> dict:
    config = config if config is not None else ActorConfig()
    if config.advantage.is_replaced:
        raise NotImplementedError("the spec pipeline covers compute: default only")
    outcome_spec = config.advantage.outcome_reward_shaping
    if outcome_spec is not None and outcome_spec.implementation not in ("auto", "identity"):
        raise NotImplementedError("the spec pipeline covers the identity outcome stage only")
    unit = estimator_unit(config)
    if details is None:
        details = {}

    # Process-shaping preconditions are checked before anything else (FORMAT §5 step 0).
    mode, gvpo = process_mode(config, prm)
    if mode not in ("additive", "gvpo", "process_weighted"):
        raise NotImplementedError(f"the spec pipeline covers the built-in process modes, got {mode}")
    if mode in ("gvpo", "process_weighted") and not config.token_rewards_as_adv:
        raise SpecError(f"{mode} shaping requires token_rewards_as_adv=True")
    if mode == "process_weighted" and config.mask_no_eos_with_zero:
        raise SpecError("process_weighted shaping requires mask_no_eos_with_zero=False")

    attention = [[1 if v else 0 for v in row] for row in as_lists(batch["attention_mask"])]
    B = len(attention)
    T = batch["attention_mask"].shape[1]
    seqlen = [sum(row) for row in attention]  # L_b
    raw_mask = [[1 if v else 0 for v in row] for row in as_lists(batch["loss_mask"])]

    rewards_in = batch["rewards"]
    task_rewards = [float(v) for v in as_lists(rewards_in)]
    integer_rewards = not rewards_in.is_floating_point()

    # ---- 1. length penalty (DAPO), into a copy -------------------------------------------
    # An integer reward tensor becomes float32 when a float penalty is added to some row:
    # where the row reaches the window (exceed >= 0, penalty <= 0), which is where the
    # legacy code added a float tensor (and crashed on integer rewards). Rows short of the
    # window get the integer 0 (recorded case int_rewards_overlong_short_rows_only).
    penalty = [0.0] * B
    penalized_any = False
    if config.overlong_reward_penalty:
        expected = config.max_new_tokens - config.overlong_tokens
        for b in range(B):
            generated = sum(raw_mask[b])  # the *unshifted* loss mask
            pen = f32(f32(-(generated - expected) / config.overlong_tokens)
                      * f32(config.overlong_penalty_factor))
            penalty[b] = min(pen, 0.0)
            penalized_any = penalized_any or generated - expected >= 0
    if rewards_in.dtype == torch.float64:
        rewards = [task_rewards[b] + penalty[b] for b in range(B)]
        rewards_dtype = torch.float64
    elif integer_rewards and not penalized_any:
        rewards = list(task_rewards)
        rewards_dtype = rewards_in.dtype  # an integer tensor stays integer
    else:
        rewards = [f32(task_rewards[b] + penalty[b]) for b in range(B)]
        rewards_dtype = torch.float32

    # ---- 2. outcome shaping: identity ----------------------------------------------------

    # ---- 3. scaling, clipping and reward normalization -----------------------------------
    def scale_reward(r: float) -> float:
        return f32(clip((r + config.reward_bias) * config.reward_scaling, config.reward_clip))

    score = [scale_reward(r) for r in rewards]
    norm = config.reward_norm
    if norm is None:
        pass
    elif meta is None or meta.rollout_groups is None:
        if meta is not None:
            sizes = list(meta.traj_group_sizes)
        elif "group" in (norm.mean_level, norm.std_level):
            sizes = fixed_group_sizes(B, norm.group_size, "actor.reward_norm")
        else:
            sizes = [B]
        normalized = normalize([[s] for s in score], norm, None, slices(sizes), sizes)
        score = [row[0] for row in normalized]
    elif norm.mean_level is None and norm.std_level is None:
        pass  # the rollout-aware path returns the score itself
    else:
        # One reference reward per logical rollout.
        references, rollout_of_row = [], []
        row = 0
        for group, n_rows in zip(meta.rollout_groups, meta.traj_group_sizes):
            counts = list(group.row_counts) if group is not None else [1] * n_rows
            explicit = list(group.rewards) if group is not None else [None] * n_rows
            if not explicit:
                explicit = [None] * len(counts)
            for count, ref in zip(counts, explicit):
                rows = list(range(row, row + count))
                if ref is not None:
                    references.append(scale_reward(float(ref)))  # bypasses the length penalty
                else:
                    first = rows[0]
                    for r in rows:
                        if rewards[r] != rewards[first] or task_rewards[r] != task_rewards[first]:
                            raise SpecError("rows of a split rollout have different rewards; "
                                            "supply an explicit reference reward")
                    references.append(scale_reward(rewards[first]))
                rollout_of_row.extend([len(references) - 1] * count)
                row += count
        logical = meta.logical_group_sizes
        mean, std = norm_statistics([[r] for r in references], norm, None, slices(logical),
                                    logical)
        scaled = []
        for b in range(B):
            j = rollout_of_row[b]
            scale = 1.0
            if std is not None:
                scale = std[j][0] + norm.eps
                if scale <= 2 * norm.eps:
                    scale = 1.0
            scaled.append(f32((score[b] - mean[j][0]) / scale))
        score = scaled
    details["score"] = score

    # ---- 4. alignment --------------------------------------------------------------------
    m = [[float(v) for v in shift_left(raw_mask[b])] for b in range(B)]
    turn_ids = None
    if present(batch, "turn_ids"):
        turn_ids = []
        for row_ids in as_lists(batch["turn_ids"]):
            shifted = [int(v) for v in shift_left(row_ids)]
            shifted[-1] = -1
            turn_ids.append(shifted)
    if unit == "turn" and turn_ids is None:
        raise SpecError("gae_timestep_unit='turn' requires turn_ids")

    # ---- 5. log-probs --------------------------------------------------------------------
    behaviour = [shift_left(row) for row in as_lists(batch["logprobs"])]
    out: dict[str, Any] = {}
    if present(batch, "mopd_teacher_logp_sum"):
        out["mopd_behavior_logprobs"] = tensor_f32(
            [[behaviour[b][t] * m[b][t] for t in range(T)] for b in range(B)])
    if config.recompute_logprob and not config.use_decoupled_loss:
        if not present(batch, "prox_logp"):
            raise SpecError("recompute_logprob=True needs prox_logp")
        old = as_lists(batch["prox_logp"])
    else:
        old = behaviour
    old = [[old[b][t] * m[b][t] for t in range(T)] for b in range(B)]
    if present(batch, "ref_logp"):
        ref_in = as_lists(batch["ref_logp"])
        ref = [[ref_in[b][t] * m[b][t] for t in range(T)] for b in range(B)]
    else:
        ref = [[0.0] * T for _ in range(B)]

    # ---- 6. KL and outcome placement -----------------------------------------------------
    if present(batch, "is_truncated"):
        flag = batch["is_truncated"]
        if not isinstance(flag, torch.Tensor) or tuple(flag.shape) != (B,):
            raise SpecError("is_truncated must be a [B] tensor")
        truncated = [bool(v) for v in as_lists(flag)]
    else:
        truncated = [seqlen[b] == T for b in range(B)]

    kl = [[0.0] * T for _ in range(B)]
    for b in range(B):
        for t in range(T):
            d = old[b][t] - ref[b][t]
            if config.kl_estimator == "k1":
                est = d
            elif config.kl_estimator == "k2":
                est = d * d / 2
            else:
                est = math.exp(-d) - 1 + d
            kl[b][t] = -config.kl_ctl * clip(est, 10.0)
    gae_kl = [list(row) for row in kl]
    for b in range(B):
        gae_kl[b][seqlen[b] - 1] = 0.0

    outcome = [[0.0] * T for _ in range(B)]
    dropped = []
    for b in range(B):
        pos = max(seqlen[b] - 2, 0)
        value = score[b]
        if config.mask_no_eos_with_zero and truncated[b]:
            value = 0.0
        outcome[b][pos] = value
        if m[b][pos] == 0:
            dropped.append((b, value))
    details["dropped"] = dropped

    # ---- 7. token (process) rewards ------------------------------------------------------
    direct = None
    folded = None
    if present(batch, "token_rewards"):
        tr = batch["token_rewards"]
        if tuple(tr.shape) != (B, T):
            raise SpecError(f"token_rewards must be [B, T] = {(B, T)}, got {tuple(tr.shape)}")
        tr = [[f32(v) for v in row] for row in as_lists(tr)]
        for b in range(B):
            if config.mask_no_eos_with_zero and truncated[b]:
                tr[b] = [0.0] * T
        shifted = [shift_left(tr[b]) for b in range(B)]
        if config.token_rewards_as_adv:
            direct = [[shifted[b][t] * m[b][t] for t in range(T)] for b in range(B)]
        else:
            raw_turns = as_lists(batch["turn_ids"]) if present(batch, "turn_ids") else None
            for b in range(B):
                if raw_turns is not None:
                    # one turn = every generated token with its id, masked tokens between
                    # them included: one reward for all of them
                    seen = {}
                    for t in range(T):
                        if raw_mask[b][t]:
                            if seen.setdefault(raw_turns[b][t], tr[b][t]) != tr[b][t]:
                                raise SpecError("token_rewards_as_adv=False requires uniform "
                                                "token rewards within each turn")
                    continue
                for t in range(T - 1):
                    if raw_mask[b][t] and raw_mask[b][t + 1] and tr[b][t] != tr[b][t + 1]:
                        raise SpecError("token_rewards_as_adv=False requires uniform token "
                                        "rewards within each turn")
            folded = [[0.0] * T for _ in range(B)]
            for b in range(B):
                for t in range(T):
                    if m[b][t] != 1:
                        continue
                    if turn_ids is None:   # a turn is a run of generated tokens
                        last_of_turn = t + 1 >= T or m[b][t + 1] == 0
                    else:   # the next generated position belongs to another turn (or none)
                        later = [u for u in range(t + 1, T) if m[b][u] == 1]
                        last_of_turn = not later or turn_ids[b][later[0]] != turn_ids[b][t]
                    if last_of_turn:
                        folded[b][t] = shifted[b][t]

    # ---- 8. temporal estimation ----------------------------------------------------------
    if unit == "token":
        step_rewards = [[gae_kl[b][t] + outcome[b][t] for t in range(T)] for b in range(B)]
    else:
        step_rewards = [[outcome[b][t] for t in range(T)] for b in range(B)]
    if folded is not None:
        for b in range(B):
            for t in range(T):
                step_rewards[b][t] += folded[b][t]

    values = as_lists(batch["values"]) if present(batch, "values") else [[0.0] * T for _ in range(B)]
    bootstrap = [values[b][seqlen[b] - 1] * (1.0 if truncated[b] else 0.0) for b in range(B)]

    token_lengths = [int(sum(m[b])) for b in range(B)]
    turn_counts = [0] * B
    if turn_ids is not None:
        turn_counts = [len({turn_ids[b][t] for t in range(T) if m[b][t] == 1}) for b in range(B)]
    lam = row_lambdas(config, token_lengths, turn_counts, unit)
    gamma = config.discount

    advantages = [[0.0] * T for _ in range(B)]
    returns = [[0.0] * T for _ in range(B)]
    if unit == "token":
        for b in range(B):
            last_adv, next_value = 0.0, bootstrap[b]
            for t in reversed(range(T - 1)):
                delta = step_rewards[b][t] + gamma * next_value - values[b][t]
                candidate = delta + gamma * lam[b] * last_adv
                if m[b][t] == 1:
                    last_adv = candidate
                    next_value = values[b][t]
                advantages[b][t] = last_adv
            advantages[b][T - 1] = 0.0
            returns[b] = [advantages[b][t] + values[b][t] for t in range(T)]
        total_rewards = step_rewards
    else:
        for b in range(B):
            active = [t for t in range(T) if m[b][t] == 1]
            previous = -1
            for t in active:
                u = turn_ids[b][t]
                if u < 0:
                    raise SpecError("turn_ids must be non-negative at every active token")
                if u >= T:
                    raise SpecError("turn_ids must be < T at every active token")
                if u < previous:
                    raise SpecError("turn_ids must be non-decreasing along a row")
                previous = u
            turns = sorted({turn_ids[b][t] for t in active})
            turn_reward = {u: 0.0 for u in turns}
            turn_value = {}
            for t in active:
                u = turn_ids[b][t]
                turn_reward[u] += step_rewards[b][t]
                turn_value.setdefault(u, values[b][t])  # value at the turn's first active token
            turn_adv = {}
            last_adv, next_value = 0.0, bootstrap[b]
            for u in reversed(turns):
                delta = turn_reward[u] + gamma * next_value - turn_value[u]
                last_adv = delta + gamma * lam[b] * last_adv
                turn_adv[u] = last_adv
                next_value = turn_value[u]
            for t in range(T):
                if m[b][t] == 1:
                    u = turn_ids[b][t]
                    advantages[b][t] = turn_adv[u]
                    returns[b][t] = turn_adv[u] + turn_value[u]
                else:
                    advantages[b][t] = 0.0
                    returns[b][t] = values[b][t]
            for t in range(T):
                advantages[b][t] += gae_kl[b][t]  # KL stays out of the returns
        total_rewards = [[step_rewards[b][t] + gae_kl[b][t] for t in range(T)] for b in range(B)]
    details["adv_raw"] = [list(row) for row in advantages]

    # ---- 9. advantage normalization ------------------------------------------------------
    adv_norm = config.adv_norm
    details["adv_scale"] = None
    if adv_norm is not None:
        if meta is not None:
            rows_of_groups = slices(meta.traj_group_sizes)
            members = meta.logical_group_sizes
        elif "group" in (adv_norm.mean_level, adv_norm.std_level):
            sizes = fixed_group_sizes(B, adv_norm.group_size, "actor.adv_norm")
            rows_of_groups, members = slices(sizes), sizes
        else:
            rows_of_groups, members = [list(range(B))], [B]
        info: dict = {}
        advantages = normalize(advantages, adv_norm, m, rows_of_groups, members, info)
        details["adv_scale"] = info["scale"]
    details["adv_normalized"] = [list(row) for row in advantages]

    # ---- 10. process advantage shaping ---------------------------------------------------
    details["mode"], details["gvpo"], details["direct"] = mode, gvpo, direct
    details["loss_mask"], details["values"] = m, values
    if direct is not None:
        advantages = shape_process(advantages, direct, m, mode, gvpo)

    # ---- outputs (SPEC §5) ---------------------------------------------------------------
    for key, value in batch.items():
        out.setdefault(key, value.clone() if isinstance(value, torch.Tensor) else value)
    out["advantages"] = tensor_f32(advantages)
    if adv_norm is not None:
        # not in the spec's output list: the module's extra for logging (see module.py)
        out["unnormalized_advantages"] = tensor_f32(details["adv_raw"])
    out["returns"] = tensor_f32(returns)
    out["tot_rewards"] = tensor_f32(total_rewards)
    out["kl_rewards"] = tensor_f32(kl)
    out["loss_mask"] = tensor_f32(m)
    out["logprobs"] = tensor_f32(old)
    if not config.use_decoupled_loss:
        out["prox_logp"] = tensor_f32(old)
    if present(batch, "ref_logp"):
        out["ref_logp"] = tensor_f32(ref)
    if rewards_dtype.is_floating_point:
        out["rewards"] = torch.tensor(rewards, dtype=rewards_dtype)
    else:
        out["rewards"] = torch.tensor([int(r) for r in rewards], dtype=rewards_dtype)
    out["is_truncated"] = torch.tensor(truncated, dtype=torch.bool)
    out["input_token_loss_mask"] = batch["loss_mask"].clone()
    return out


def shape_process(advantages: list, direct: list, m: list, mode: str, gvpo: dict) -> list:
    """SPEC §3 step 10 on every element (A = normalized advantages, r = direct rewards)."""
    B, T = len(advantages), len(advantages[0])
    if mode == "gvpo":
        for name in ("negative_scale", "zero_penalty", "zero_eps"):
            value = gvpo[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise SpecError(f"GVPO {name} must be finite and non-negative, got {value}")
    if mode == "process_weighted":
        for b in range(B):
            for t in range(T):
                if m[b][t] == 1 and not 0.0 <= direct[b][t] <= 1.0:
                    raise SpecError("process_weighted shaping requires process rewards in [0, 1]")
    shaped = [list(row) for row in advantages]
    for b in range(B):
        for t in range(T):
            a, r = advantages[b][t], direct[b][t]
            shaped[b][t] = shape_one(a, r, m[b][t] == 1, mode, gvpo)
    return shaped


def shape_one(a: float, r: float, active: bool, mode: str, gvpo: dict) -> float:
    if mode == "additive":
        return a + r  # r is 0 off the mask
    if mode == "gvpo":
        failed = active and r < 0
        if not failed:
            return a
        eps = gvpo["zero_eps"]
        if a < -eps:
            return (1 + gvpo["negative_scale"]) * a
        if abs(a) <= eps:
            return -gvpo["zero_penalty"]
        return 0.0
    # process_weighted
    if not active:
        return a
    if a >= 0:
        return a * r
    return r if r > 0 else a
