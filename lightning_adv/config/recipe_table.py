"""The recipe table: estimators from other frameworks as sets of ``ActorConfig`` fields.

Plain data (no imports from the package), so the config can fill itself from a recipe
name without a cycle. This table is the one source:
``configs/advantage/<name>.yaml`` are generated from it (``python
scripts/write_recipe_configs.py``), and a test keeps them in step; so is the recipe
reference of the documentation (``python scripts/generate_reference.py``), which shows the
table below. Three ways to use one:

- ``lightning_adv.recipes.recipe(name, **overrides)`` in Python;
- ``model.actor.recipe: name`` in a trainer config: the recipe supplies every actor field
  left at its ``ActorConfig`` default; a field set to another value overrides the recipe
  (a ``RecipeOverrideWarning`` names each one). The stage tree counts stage by stage
  (``advantage.process_adv_shaping: gvpo`` keeps the recipe's estimator). A field set to
  its default value cannot be told from one left unset, so it takes the recipe's value;
- ``--model.actor=configs/advantage/<name>.yaml``: the files set every field, so they
  replace a config's whole actor section; flags after it override single fields.
In the formulas, ``r`` is a row's outcome reward, ``g`` its prompt group, ``G_t`` the
discounted return-to-go from token ``t``. Critic-free recipes leave ``values`` out of the
batch, so every generated token of a row gets the row's advantage (gamma = lambda = 1).

| recipe | advantage of every token of row i | source |
|---|---|---|
| grpo | (r_i - mean_g r) / (std_g r + eps) | Shao et al., 2024, DeepSeekMath, arXiv:2402.03300 |
| dr_grpo | r_i - mean_g r | Liu et al., 2025, Understanding R1-Zero-Like Training, arXiv:2503.20783 |
| rloo | r_i - mean of the other logical rollouts of g | Ahmadian et al., 2024, Back to Basics, arXiv:2402.14740 |
| reinforce_pp | whiten_batch(G_t), KL penalty in the token rewards | Hu, 2025, REINFORCE++, arXiv:2501.03262 |
| reinforce_pp_baseline | whiten_batch(G_t) with r_i - mean_g r as outcome | Hu, 2025, REINFORCE++, arXiv:2501.03262 |
| opo | r_i - sum_g(l_j r_j) / sum_g(l_j), l = response length | Hao et al., 2025, OPO, arXiv:2505.23585 |
| gpg | B / (B - M) * (r_i - mean_g r), M responses of all-equal groups | Chu et al., 2025, GPG, arXiv:2504.02546 |
| grpo_passk | best response of g: (r_max - r_second) / (std_g r + eps), others 0 | verl grpo_passk |
| gdpo | whiten_batch(sum_k w_k (r_ik - mean_g r_k) / (std_g r_k + eps)) | GDPO, arXiv:2601.05242 |
| grpo_batch_std | (r_i - mean_g r) / (std_batch r + eps) | TRL scale_rewards="batch" |
| rloo_kl | RLOO of r_i - beta * sum_t (logprobs_t - ref_logp_t) | TRL RLOOTrainer |
| remax | G_t - b_i, b_i a greedy response's reward | Li et al., 2024, ReMax, arXiv:2310.10505 |
| optimal_token_baseline | G_t - sum_g(G_t W_t) / sum_g(W_t), per generated step | verl optimal_token_baseline |
| tir_optimal_token_baseline | the same (steps over generated tokens; tool outputs are not steps) | verl tir_optimal_token_baseline |
| maxrl | (r_i - mean_g r) / mean_g r, 0 where mean_g r <= 0 | MaxRL, arXiv:2602.02710 (prime-rl, SkyRL) |
| turn_rloo | turn k: G_k - mean of G_k over the group's other episodes that reached turn k | this project (docs/guides/agents.md) |
| gigpo | turn k: episode-level group advantage + anchor-state group advantage of G_k | Feng et al., 2025, GiGPO, arXiv:2505.10978 (ROLL) |
| tree_grpo | (r_i - mean_g r) / (std_g r + eps) + the same over the row's tree | Ji et al., 2025, Tree-GRPO, arXiv:2509.21240 |
| treepo | whiten_batch(size-weighted mean of r_i - mean over g and over each subtree of the row) | Li et al., 2025, TreePO, arXiv:2508.17445 |
| treerl | tokens of node n: V(n) - V(parent) + V(n), V = mean leave-one-out reward below n - its token mean | Hou et al., 2025, TreeRL, ACL 2025 |

GRPO-family recipes set ``kl_ctl: 0``: those methods regularize with a KL term in the
loss, which is the trainer's business, not a reward penalty.
"""

from __future__ import annotations

import math
from typing import Any

_GROUP_MEAN = {"mean_level": "group", "std_level": None}
_BATCH_WHITENING = {"mean_level": "batch", "std_level": "batch"}
_CRITIC_FREE = {"kl_ctl": 0.0, "discount": 1.0, "gae_lambda": 1.0}

RECIPES: dict[str, dict[str, Any]] = {
    "grpo": {**_CRITIC_FREE, "reward_norm": {"mean_level": "group", "std_level": "group"},
             "advantage": {"estimator": {"implementation": "token_gae"}}},
    "dr_grpo": {**_CRITIC_FREE, "reward_norm": dict(_GROUP_MEAN),
                "advantage": {"estimator": {"implementation": "token_gae"}}},
    "rloo": {**_CRITIC_FREE,
             "reward_norm": {"mean_level": "group", "mean_leave1out": True, "std_level": None},
             "advantage": {"estimator": {"implementation": "token_gae"}}},
    "reinforce_pp": {"kl_ctl": 0.01, "discount": 1.0, "adv_norm": dict(_BATCH_WHITENING),
                     "advantage": {"estimator": {"implementation": "reinforce"}}},
    "reinforce_pp_baseline": {"kl_ctl": 0.01, "discount": 1.0, "reward_norm": dict(_GROUP_MEAN),
                              "adv_norm": dict(_BATCH_WHITENING),
                              "advantage": {"estimator": {"implementation": "reinforce"}}},
    "opo": {**_CRITIC_FREE, "reward_clip": math.inf,
            "advantage": {"outcome_reward_shaping": {"implementation": "opo_baseline"},
                          "estimator": {"implementation": "token_gae"}}},
    "gpg": {**_CRITIC_FREE, "reward_clip": math.inf,
            "advantage": {"outcome_reward_shaping": {"implementation": "gpg"},
                          "estimator": {"implementation": "token_gae"}}},
    "grpo_passk": {**_CRITIC_FREE, "reward_clip": math.inf,
                   "advantage": {"outcome_reward_shaping": {"implementation": "passk_baseline"},
                                 "estimator": {"implementation": "token_gae"}}},
    "gdpo": {**_CRITIC_FREE, "reward_clip": math.inf, "reward_aggregation": "normalize_then_sum",
             "reward_norm": {"mean_level": "batch", "std_level": "batch", "eps": 1e-4},
             "advantage": {"estimator": {"implementation": "token_gae"}}},
    "grpo_batch_std": {**_CRITIC_FREE, "reward_clip": math.inf,
                       "advantage": {"outcome_reward_shaping": {
                           "implementation": "group_mean_batch_std"},
                           "estimator": {"implementation": "token_gae"}}},
    "rloo_kl": {**_CRITIC_FREE, "reward_clip": math.inf,
                "reward_norm": {"mean_level": "group", "mean_leave1out": True, "std_level": None},
                "advantage": {"outcome_reward_shaping": {"implementation": "sequence_kl",
                                                         "kwargs": {"beta": 0.05}},
                              "estimator": {"implementation": "token_gae"}}},
    "remax": {"kl_ctl": 0.001, "discount": 1.0, "gae_lambda": 1.0, "reward_clip": math.inf,
              "advantage": {"outcome_reward_shaping": {"implementation": "remax_baseline"},
                            "estimator": {"implementation": "reinforce"}}},
    "optimal_token_baseline": {**_CRITIC_FREE, "reward_clip": math.inf,
                               "advantage": {"estimator": {"implementation": "optimal_token_baseline"}}},
    "tir_optimal_token_baseline": {**_CRITIC_FREE, "reward_clip": math.inf, "advantage": {
        "estimator": {"implementation": "tir_optimal_token_baseline"}}},
    "maxrl": {**_CRITIC_FREE, "reward_clip": math.inf,
              "advantage": {"outcome_reward_shaping": {"implementation": "maxrl"},
                            "estimator": {"implementation": "token_gae"}}},
    "turn_rloo": {**_CRITIC_FREE, "reward_clip": math.inf,
                  "advantage": {"estimator": {"implementation": "turn_rloo"}}},
    "gigpo": {**_CRITIC_FREE, "reward_clip": math.inf,
              "advantage": {"estimator": {"implementation": "gigpo"}}},
    "tree_grpo": {**_CRITIC_FREE, "reward_clip": math.inf,
                  "advantage": {"estimator": {"implementation": "tree_grpo"}}},
    "treepo": {**_CRITIC_FREE, "reward_clip": math.inf, "adv_norm": dict(_BATCH_WHITENING),
               "advantage": {"estimator": {"implementation": "treepo"}}},
    "treerl": {**_CRITIC_FREE, "reward_clip": math.inf,
               "advantage": {"estimator": {"implementation": "treerl"}}},
}


#: One line per recipe: what it computes and its source (the header of its YAML).
SUMMARIES: dict[str, str] = {
    "dr_grpo":
        "Dr. GRPO: group mean baseline, no std division (Liu et al., 2025, arXiv:2503.20783).",
    "gpg":
        "GPG: group-mean baseline rescaled by B/(B-M), M = responses of all-equal groups (Chu et al., 2025, arXiv:2504.02546).",
    "grpo":
        "GRPO: group mean/std normalized outcome reward on every token (Shao et al., 2024, arXiv:2402.03300).",
    "opo":
        "OPO: length-weighted group baseline sum(l*r)/sum(l) (Hao et al., 2025, arXiv:2505.23585).",
    "reinforce_pp":
        "REINFORCE++: discounted return-to-go with the token KL penalty in the rewards, whitened over the batch (Hu, 2025, arXiv:2501.03262).",
    "reinforce_pp_baseline":
        "REINFORCE++-baseline: group-mean reward baseline, then return-to-go whitened over the batch (Hu, 2025, arXiv:2501.03262).",
    "rloo":
        "RLOO: leave-one-out mean of the other logical rollouts of the prompt as baseline (Ahmadian et al., 2024, arXiv:2402.14740).",
    "grpo_passk":
        "Pass@k GRPO: only each group's best response gets (r_max - r_second)/(std + eps) (verl's grpo_passk).",
    "gdpo":
        "GDPO: each reward column normalized within its group, weighted sum, whitened over the batch (arXiv:2601.05242; TRL's normalize_then_sum).",
    "grpo_batch_std":
        "GRPO with batch scaling: group-mean baseline over the std of the whole batch's rewards (TRL's scale_rewards='batch', arXiv:2508.08221).",
    "rloo_kl":
        "RLOO with a sequence KL penalty: r - beta * sum(logprobs - ref_logp) before the leave-one-out baseline (TRL's RLOOTrainer).",
    "remax":
        "ReMax: the reward of one greedy response per prompt as baseline of the return-to-go (Li et al., 2024, arXiv:2310.10505).",
    "optimal_token_baseline":
        "Optimal token baseline: per-step group baseline weighted by the cumulative path variance (verl's optimal_token_baseline).",
    "tir_optimal_token_baseline":
        "Tool-integrated optimal token baseline: the optimal token baseline with steps counted over generated tokens (verl's tir_optimal_token_baseline).",
    "maxrl":
        "MaxRL: group-mean baseline divided by the group mean, 0 for groups of mean <= 0 (arXiv:2602.02710; prime-rl's max_rl, SkyRL's maxrl).",
    "turn_rloo":
        "Per-turn rewards: each turn's discounted return minus the leave-one-out mean over the group's episodes that reached that turn; unbiased under variable turn counts.",
    "gigpo":
        "GiGPO: episode-level group advantage plus the step return normalized within anchor-state groups (Feng et al., 2025, arXiv:2505.10978; ROLL's adv_estimator gigpo).",
    "tree_grpo":
        "Tree-GRPO: the row reward normalized within its prompt group plus within its tree (Ji et al., 2025, arXiv:2509.21240; adv_estimator tree).",
    "treepo":
        "TreePO: the row reward minus the mean of its prompt group and of each subtree it passes, weighted by size, whitened over the batch (Li et al., 2025, arXiv:2508.17445).",
    "treerl":
        "TreeRL: each node's tokens get its value's change from its parent's plus its value, values the mean leave-one-out leaf reward below (Hou et al., ACL 2025).",
}
