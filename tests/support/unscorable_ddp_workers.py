"""Worker of the DDP tests of unscorable rows (gloo, CPU processes, ``torch.multiprocessing``).

Each rank takes two prompt groups of one global batch (``ddp_probe.prompt_groups``: split
rollouts, critic values, reference log-probs, process rewards) and runs every config of
:data:`CONFIGS` under ``actor.unscorable_rewards: exclude`` in every scenario of
:data:`SCENARIOS`, saving what it computed (or the error it raised) to
``<out_dir>/rank<r>.pt``. Lives in an importable module because spawn pickles the worker.
"""

from __future__ import annotations

import math
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tests.support.ddp_probe import prompt_groups
from lightning_adv import ActorConfig, AdvantageModule, OutcomeResult, concat_batch
from lightning_adv.distributed import all_reduce_sum
from lightning_adv.recipes import RECIPES


def centred_on_batch_mean(inputs) -> OutcomeResult:
    """A user outcome stage with its own batch statistic, reduced through
    ``lightning_adv.distributed.all_reduce_sum`` as README asks: the rewards minus the
    global mean reward per row."""
    rewards = inputs.data["rewards"].double()
    total, count = all_reduce_sum(torch.stack([rewards.sum(), torch.tensor(
        float(rewards.numel()), dtype=torch.float64, device=rewards.device)]))
    return OutcomeResult(rewards=(rewards - total / count).float())


KEYS = ("advantages", "returns", "rewards", "tot_rewards", "kl_rewards", "loss_mask", "unscorable")
CONFIGS = {
    # batch-level reward and advantage normalization (sums and counts all-reduced)
    "batch_norms": {"reward_norm": {"mean_level": "batch", "std_level": "batch"},
                    "adv_norm": {"mean_level": "batch", "mean_leave1out": True, "std_level": "batch"},
                    "discount": 0.9, "gae_lambda": 0.95},
    "group_reward_batch_adv": {"reward_norm": {"mean_level": "group", "std_level": "group"},
                               "adv_norm": {"mean_level": "batch", "std_level": "batch"}},
    "gpg": RECIPES["gpg"],
    "grpo_batch_std": RECIPES["grpo_batch_std"],
    "reinforce_pp": RECIPES["reinforce_pp"],
    "rloo_kl": RECIPES["rloo_kl"],
    # a user stage: the stand-in of a rank without scored rows adds nothing to its sums
    "user_stage_batch_mean": {"advantage": {"outcome_reward_shaping": {
        "implementation": "tests.support.unscorable_ddp_workers.centred_on_batch_mean"}}},
}
#: scenario -> the rows whose reward is NaN, per prompt of the global batch (4 prompts)
SCENARIOS = {
    "rank1_all_unscorable": {2: "all", 3: "all"},
    "partly_unscorable": {1: [2], 2: [0, 3]},
    "no_row_scored": {0: "all", 1: "all", 2: "all", 3: "all"},
}


def scenario_groups(scenario: str) -> list[dict]:
    """The global batch's prompt groups with the scenario's rewards set to NaN. A split
    logical rollout (rows 0 and 1 of odd prompts) is NaN on both rows or neither."""
    groups = prompt_groups(n_prompts=4)
    for prompt, rows in SCENARIOS[scenario].items():
        rewards = groups[prompt]["rewards"].clone()
        if rows == "all":
            rewards[:] = math.nan
        else:
            rewards[rows] = math.nan
        groups[prompt] = {**groups[prompt], "rewards": rewards}
    return groups


def advantages(config: dict, groups: list[dict]) -> dict:
    batch, meta = concat_batch(groups)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = AdvantageModule(ActorConfig(**config, unscorable_rewards="exclude"))(batch, meta)
    return {k: out[k] for k in KEYS} | {"values": batch["values"]}


def worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    # A collective nobody joins fails after the timeout instead of blocking forever.
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    try:
        results = {}
        for scenario in SCENARIOS:
            mine = scenario_groups(scenario)[2 * rank: 2 * rank + 2]
            for name, config in CONFIGS.items():
                try:
                    results[scenario, name] = advantages(config, mine)
                except (ValueError, RuntimeError) as exc:
                    results[scenario, name] = {"error": f"{type(exc).__name__}: {exc}"}
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
        dist.barrier()  # neither rank tears gloo down while its peer still talks
    finally:
        dist.destroy_process_group()
