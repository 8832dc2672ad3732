"""Estimators from other frameworks, expressed through the pipeline's stages.

Each recipe is a set of ``ActorConfig`` fields, usable under ``model.actor`` in a trainer
config. This module is the one source: ``configs/advantage/<name>.yaml`` are generated
from it (``python -m lightning_adv.recipes --write configs/advantage``), and a test keeps
them in step.
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
import sys
from pathlib import Path
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


#: One line per recipe: what it computes and its source (the header of its YAML).
SUMMARIES: dict[str, str] = {
    "dr_grpo":
        "Dr. GRPO: group mean baseline, no std division (Liu et al., 2025, arXiv:2503.20783).",
    "gpg":
        "GPG: group-mean baseline rescaled by B/(B-M), M = rows of all-equal groups (Chu et al., 2025, arXiv:2504.02546).",
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
}


def recipe(name: str, **overrides: Any) -> ActorConfig:
    """The ``ActorConfig`` of a named recipe, with optional field overrides."""
    if name not in RECIPES:
        raise ValueError(f"recipe: expected one of {', '.join(RECIPES)}, got {name!r}")
    return ActorConfig(**{**copy.deepcopy(RECIPES[name]), **overrides})


def recipe_yaml(name: str) -> str:
    """The text of ``configs/advantage/<name>.yaml``, generated from :data:`RECIPES`."""
    import yaml  # PyYAML comes with jsonargparse

    if name not in RECIPES:
        raise ValueError(f"recipe: expected one of {', '.join(RECIPES)}, got {name!r}")
    body = yaml.safe_dump(RECIPES[name], sort_keys=False, default_flow_style=False)
    return (f"# {SUMMARIES[name]}\n"
            f"# Use under model.actor of a trainer config, or lightning_adv.recipes.recipe({name!r}).\n"
            f"# Generated by `python -m lightning_adv.recipes --write configs/advantage`; edit "
            f"lightning_adv/recipes.py instead.\n{body}")


def write_recipe_files(directory: Path) -> list[Path]:
    """Write one YAML per recipe into ``directory``; the files that were written."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in RECIPES:
        path = directory / f"{name}.yaml"
        path.write_text(recipe_yaml(name))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> None:
    """``python -m lightning_adv.recipes --write DIR`` (the YAMLs) or ``NAME`` (print one)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--write":
        for path in write_recipe_files(Path(args[1])):
            print(path)
    elif len(args) == 1 and args[0] in RECIPES:
        print(recipe_yaml(args[0]), end="")
    else:
        raise SystemExit(f"usage: python -m lightning_adv.recipes --write DIR | NAME "
                         f"(one of {', '.join(RECIPES)})")


if __name__ == "__main__":
    main()
