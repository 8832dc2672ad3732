"""The built-in trainer feeds the entropy stages (``gtpo``, ``top_entropy_mask``) their
``entropies``: from the scoring pass of the policy at the sampling temperature, only when
a selected stage requires them; and a fit of two steps with the stage chosen in the YAML
tree trains end to end."""

import torch

from lightning_adv.recipes import recipe
from lightning_adv.stages.entropy_shaping import top_entropy_mask
from lightning_adv import ProcessAdvantageInputs
from lightning_adv.trainer.data import generator
from lightning_adv.trainer.ppo import PPOModule
from tests.support.cli_runs import fit, scalars

RECORDER = "--model.advantage_module=tests.support.trainer_helpers.RecordingAdvantageModule"
TINY = {"policy": {"d_model": 16, "n_layers": 1, "n_heads": 2, "value_head": False},
        "ppo": {"prompts_per_step": 2, "n_samples": 4, "minibatches": 2, "epochs": 1,
                "temperature": 0.7},
        "task": {"name": "addition", "kwargs": {"max_operand": 9}}, "seed": 3}


def with_stage(implementation, **kwargs):
    actor = recipe("grpo")
    return actor.__class__(**{**actor.__dict__, "advantage": {
        **actor.advantage.__dict__, "process_adv_shaping": {
            "implementation": implementation, "kwargs": kwargs}}})


def test_entropies_come_from_the_policys_logits_when_a_stage_reads_them():
    model = PPOModule(actor=with_stage("gtpo"), **TINY)
    assert model.rollouts.keys.recipe_inputs == {"entropies"}
    batch, meta = model.make_batch(model.rollout([0, 1], generator(3, "test")))
    logits, _ = model.policy(batch["input_ids"])
    logp = torch.log_softmax(logits.float() / 0.7, -1)  # the sampling temperature's distribution
    want = -(logp.exp() * logp).sum(-1)
    next_real = torch.nn.functional.pad(batch["attention_mask"][:, 1:].float(), (0, 1))
    torch.testing.assert_close(batch["entropies"], want * next_real, atol=1e-5, rtol=1e-5)
    assert bool((batch["entropies"] > 0).any())
    out = model.advantage(batch, meta)
    assert torch.isfinite(out["advantages"]).all()
    plain = PPOModule(actor=recipe("grpo"), **TINY)
    assert "entropies" not in plain.make_batch(plain.rollout([0, 1], generator(3, "t")))[0]


def fit_with_stage(tmp_path, monkeypatch, implementation, kwargs):
    """Four training steps of configs/grpo.yaml on the reverse task (partial credit: the
    rewards of a group differ early), the stage chosen in a YAML tree; each step's batch."""
    monkeypatch.setenv("LIGHTNING_ADV_RECORD", str(tmp_path))
    stage = tmp_path / "stage.yaml"
    stage.write_text(f"model:\n  actor:\n    advantage:\n      process_adv_shaping:\n"
                     f"        implementation: {implementation}\n        kwargs: {kwargs}\n")
    fit("grpo", tmp_path, "--config", str(stage), RECORDER, "--model.task.name=reverse",
        "--model.task.kwargs={alphabet: abcde, min_len: 2, max_len: 4}",
        "--model.ppo.lr=0.01", "--trainer.limit_train_batches=4")
    assert len(scalars(tmp_path / "grpo" / "version_0")["train/task_reward"]) == 4
    return [torch.load(tmp_path / f"rank0_call{i}.pt", weights_only=True) for i in range(4)]


def test_top_entropy_mask_trains_from_the_yaml_tree(tmp_path, monkeypatch):
    mixed_rows = 0
    for out in fit_with_stage(tmp_path, monkeypatch, "top_entropy_mask", "{quantile: 0.5}"):
        mask, adv = out["loss_mask"], out["advantages"]
        assert out["entropies"].shape == adv.shape
        # the stage ran on what the trainer computed: the stage on the recorded entropies
        # leaves the recorded advantages as they are (0 on the low-entropy tokens already)
        inputs = ProcessAdvantageInputs(adv, None, mask, None, None,
                                        {"entropies": out["entropies"]})
        torch.testing.assert_close(top_entropy_mask(inputs, quantile=0.5), adv)
        active = mask > 0
        mixed_rows += int((((adv != 0) & active).any(1) & ((adv == 0) & active).any(1)).sum())
    assert mixed_rows > 0  # GRPO's one advantage per row, masked on some of its tokens


def test_gtpo_trains_from_the_yaml_tree(tmp_path, monkeypatch):
    varied_rows = 0
    for out in fit_with_stage(tmp_path, monkeypatch, "gtpo", "{entropy_weight: 1.0}"):
        mask, adv, entropies = out["loss_mask"], out["advantages"], out["entropies"]
        n = mask.sum(1).clamp(min=1)
        # GRPO's one advantage per row is the row's mean; each token gets mean * H / mean(H)
        mean = (adv * mask).sum(1) / n
        mean_h = (entropies * mask).sum(1) / n
        expected = mean[:, None] * entropies / mean_h[:, None]
        torch.testing.assert_close(adv * mask, expected * mask, rtol=1e-4, atol=1e-6)
        spread = torch.where(mask > 0, adv, mean[:, None]).amax(1) - torch.where(
            mask > 0, adv, mean[:, None]).amin(1)
        varied_rows += int((spread > 1e-4).sum())
    assert varied_rows > 0
