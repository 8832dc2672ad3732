"""Estimators from other frameworks, expressed through the pipeline's stages.

Each recipe is a set of ``ActorConfig`` fields (the same content as
``configs/advantage/<name>.yaml``, usable under ``model.actor`` in a trainer config).
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
| gpg | B / (B - M) * (r_i - mean_g r), M rows of all-equal groups | Chu et al., 2025, GPG, arXiv:2504.02546 |

GRPO-family recipes set ``kl_ctl: 0``: those methods regularize with a KL term in the
loss, which is the trainer's business, not a reward penalty.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from lightning_adv.config import ActorConfig

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
}


def recipe(name: str, **overrides: Any) -> ActorConfig:
    """The ``ActorConfig`` of a named recipe, with optional field overrides."""
    if name not in RECIPES:
        raise ValueError(f"recipe: expected one of {', '.join(RECIPES)}, got {name!r}")
    return ActorConfig(**{**copy.deepcopy(RECIPES[name]), **overrides})
