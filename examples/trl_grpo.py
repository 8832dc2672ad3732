"""This project's advantages inside TRL's GRPOTrainer: recipe RLOO, a per-token process
reward shaping the advantages (additive), and PPOLoss in place of TRL's loss; TRL
generates, scores and steps the optimizer as usual.

    pip install 'lightning_adv[trl]'
    python -m examples.trl_grpo [model_dir] [max_steps]

Without a model directory it writes a tiny random one (make_tiny) into a temporary folder.
"""

from __future__ import annotations

import sys
import tempfile

from datasets import Dataset
from trl import GRPOConfig

from lightning_adv import PPOLoss, recipe
from lightning_adv.integrations.trl import AdvantageGRPOTrainer


def brevity(completions, **columns):
    """A TRL reward function: shorter completions score higher."""
    return [1.0 / (1.0 + len(c)) for c in completions]


def no_repeats(prompts, completions, completion_ids, **columns):
    """A process reward: -0.05 on each token that repeats the one before it."""
    return [[-0.05 if i and ids[i] == ids[i - 1] else 0.0 for i in range(len(ids))]
            for ids in completion_ids]


def main(model_dir: str | None = None, max_steps: int = 2, output_dir: str | None = None):
    if model_dir is None:
        from lightning_adv.trainer.policies.hf.make_tiny import make_tiny  # a tiny random LM

        model_dir = tempfile.mkdtemp(prefix="tiny_lm_")
        make_tiny(model_dir)
    args = GRPOConfig(output_dir=output_dir or tempfile.mkdtemp(prefix="trl_grpo_"),
                      per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
                      max_steps=max_steps, learning_rate=1e-3, logging_steps=1, report_to=[],
                      use_cpu=True, save_strategy="no", seed=0)
    config = recipe("rloo", advantage={"estimator": {"implementation": "token_gae"},
                                       "process_adv_shaping": {"implementation": "additive"}})
    trainer = AdvantageGRPOTrainer(
        model=model_dir, reward_funcs=[brevity], args=args,
        train_dataset=Dataset.from_dict({"prompt": ["hello", "the sky is", "one two", "abc"] * 4}),
        advantage=config, process_reward_funcs=[no_repeats], ppo_loss=PPOLoss(clip_eps=0.2))
    trainer.train()
    print(trainer.state.log_history[-2])
    return trainer


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None, *(int(a) for a in sys.argv[2:3]))
