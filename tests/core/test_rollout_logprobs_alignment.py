"""Off-policy data goes through the library: the module moves ``rollout_logprobs`` to the
next-token convention like ``logprobs`` (once, for every caller), and the trainer's
off-policy step builds a new batch instead of changing the one it was given."""

import torch

from lightning_adv import ActorConfig, AdvantageModule, BatchMeta, RolloutCorrectionConfig
from lightning_adv.trainer.config import PPOConfig
from lightning_adv.trainer.rollout.off_policy import off_policy_batch


def one_prompt_batch() -> dict:
    # two rows: prompt of 2 tokens, then 3 and 2 generated tokens (right-padded)
    loss_mask = torch.tensor([[0, 0, 1, 1, 1], [0, 0, 1, 1, 0]], dtype=torch.int32)
    return {
        "input_ids": torch.tensor([[5, 6, 7, 8, 9], [5, 6, 3, 4, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]], dtype=torch.bool),
        "loss_mask": loss_mask,
        "logprobs": torch.tensor([[0.0, 0.0, -0.1, -0.2, -0.3], [0.0, 0.0, -0.4, -0.5, 0.0]]),
        "rollout_logprobs": torch.tensor([[0.0, 0.0, -1.1, -1.2, -1.3],
                                          [0.0, 0.0, -1.4, -1.5, 0.0]]),
        "rewards": torch.tensor([1.0, 0.0]),
        "is_truncated": torch.tensor([False, False]),
    }


def test_the_module_aligns_rollout_logprobs_as_it_aligns_logprobs():
    batch = one_prompt_batch()
    out = AdvantageModule(ActorConfig(recipe="grpo"))(
        batch, BatchMeta(n_trajs=1, traj_group_sizes=[2], traj_seqlens=[5]))
    # position t scores token t+1: the generated tokens 2..4 sit at positions 1..3
    want = torch.tensor([[0.0, -1.1, -1.2, -1.3, 0.0], [0.0, -1.4, -1.5, 0.0, 0.0]])
    assert torch.equal(out["rollout_logprobs"], want)
    assert torch.equal(out["logprobs"], torch.tensor([[0.0, -0.1, -0.2, -0.3, 0.0],
                                                      [0.0, -0.4, -0.5, 0.0, 0.0]]))
    assert torch.equal(batch["rollout_logprobs"], one_prompt_batch()["rollout_logprobs"])


def test_the_off_policy_step_builds_a_new_batch():
    batch = one_prompt_batch()
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 1, 1, 0, 0]], dtype=torch.float32)
    rollout = torch.tensor([[0.0, -1.1, -1.2, -1.3, 0.0], [0.0, -1.4, -1.5, 0.0, 0.0]])
    batch["prox_logp"] = rollout + 0.3 * mask  # π_old, next-token convention
    before = {k: v.clone() for k, v in batch.items()}
    for bypass in (True, False):
        correction = (RolloutCorrectionConfig(bypass_mode=True) if bypass else
                      RolloutCorrectionConfig(rollout_is="token"))
        ppo = PPOConfig(off_policy_steps=1, rollout_correction=correction)
        out = off_policy_batch(batch, ppo, version=7, staleness=2, reads_weights=True)
        assert out is not batch and list(batch) == list(before)
        assert all(torch.equal(batch[k], v) for k, v in before.items())
        assert out["policy_version"].tolist() == [5, 5]
        if bypass:  # the rollout's log-probs are the old ones
            assert torch.equal(out["logprobs"], batch["rollout_logprobs"])
        else:  # π_old / π_rollout on the generated tokens' positions, 0 elsewhere
            weights = out["rollout_is_weights"]
            assert torch.allclose(weights, torch.exp(torch.tensor(0.3)) * mask, atol=1e-6), weights
