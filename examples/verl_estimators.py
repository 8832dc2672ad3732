"""This project's recipes as verl estimators: register() them in verl's registry, then
verl's own trainer function (ray_trainer.compute_advantage, which its PPO loop calls every
step) computes advantages with `algorithm.adv_estimator: la_rloo`, next to verl's `rloo`.

    pip install --no-deps verl==0.9.1 && pip install 'lightning_adv[verl]'
    python examples/verl_estimators.py
"""

import numpy as np
import torch
from verl import DataProto
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo.ray_trainer import compute_advantage

from lightning_adv.integrations.verl import register


def rollout_batch() -> DataProto:
    """Two prompts, three responses each (verl's layout: response tensors and a uid per
    row); the reward sits at each response's last token, as verl's reward manager puts it."""
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1],
                         [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.float32)
    scores = torch.tensor([1.0, 0.0, 0.5, 1.0, 1.0, 0.0])
    rewards = torch.zeros_like(mask)
    rewards[torch.arange(6), mask.sum(1).long() - 1] = scores
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={"uid": np.array(["q1", "q1", "q1", "q2", "q2", "q2"], dtype=object)})


def main() -> dict:
    register()  # adds la_grpo, la_rloo, ..., la_vanilla, ... to verl's registries
    results = {}
    for name in ("rloo", "la_rloo"):
        config = AlgoConfig(adv_estimator=name)
        out = compute_advantage(rollout_batch(), adv_estimator=name, config=config)
        results[name] = out.batch["advantages"]
        print(f"{name:8s} first-token advantages: {out.batch['advantages'][:, 0].tolist()}")
    return results


if __name__ == "__main__":
    main()
