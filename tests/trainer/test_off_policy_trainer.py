"""Off-policy training end to end in the built-in trainer: the rollout queue of
ppo.off_policy_steps (each batch trained on is the one sampled k versions before), rollout
log-probs as sampled (after temperature, top-k, top-p), the bf16 sampler's real mismatch,
the correction the trainer computes equal to the library's, the async configs, resume, and
the errors of bad off-policy settings."""

import copy
import subprocess
import sys
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from lightning_adv import ActorConfig, PPOLoss, rollout_correction
from lightning_adv.trainer import PPOConfig, PPOModule, PolicyConfig, TaskConfig
from lightning_adv.trainer.data import generator
from lightning_adv.trainer.policies.base import GenerationRequest, SamplingParams
from lightning_adv.trainer.policies.hf.sampling import _warpers
from lightning_adv.trainer.policies.hf.policy import build_hf_policy
from lightning_adv.trainer.rollout.off_policy import RolloutQueue, QueuedRollout
from lightning_adv.trainer.setup import TrainerPlan

REPO = Path(__file__).resolve().parents[2]
SMALL = dict(prompts_per_step=4, n_samples=4, minibatches=2, epochs=1)
TIS = {"rollout_is": "token", "rollout_is_threshold": 2.0}


def make(ppo=None, actor=None, **kwargs):
    torch.manual_seed(0)
    return PPOModule(task=TaskConfig(name="reverse"), ppo=PPOConfig(**{**SMALL, **(ppo or {})}),
                     actor=ActorConfig(**(actor or {})), seed=0, **kwargs)


def fit(module, steps):
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=steps, logger=False,
                         log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module)


class Recorder(PPOModule):
    """Records, for each update, the step, the trained rows' policy version and tokens, the
    advantage output and the weights before the update."""

    def setup(self, stage):
        super().setup(stage)
        self.updates, self.sampled = [], {}
        self.initial = [p.detach().clone() for p in self.policy.parameters()]
        step = self.updater.step

        def recorded_step(batch, out, gen, module):
            self.record_update(batch, out)
            step(batch, out, gen, module)

        self.updater.step = recorded_step

    def rollout(self, indices, gen):
        groups = super().rollout(indices, gen)
        self.sampled[self.rollout_step] = [ep.tokens for g in groups for ep in g]
        return groups

    def record_update(self, batch, out):
        self.updates.append(dict(step=self.rollout_step, batch=dict(batch), out=dict(out),
                                 weights=[p.detach().clone() for p in self.policy.parameters()]))


@pytest.mark.parametrize("k", [0, 2])
def test_each_trained_batch_was_sampled_k_policy_versions_before(k):
    module = make(ppo={"off_policy_steps": k, "rollout_correction": TIS},
                  actor={"recompute_logprob": True})
    module.__class__ = Recorder
    fit(module, 5)
    assert [u["step"] for u in module.updates] == list(range(k, 5))
    for u in module.updates:
        assert u["batch"]["policy_version"].tolist() == [u["step"] - k] * 16
        width = u["batch"]["input_ids"].shape[1]
        sampled = module.sampled[u["step"] - k]
        assert [row[:len(s)] for row, s in zip(u["batch"]["input_ids"].tolist(), sampled)] == sampled
        assert all(len(s) <= width for s in sampled)
    # the first update starts from the policy that sampled its batch (version 0: no update
    # ran while the queue filled); later ones from a policy that has moved on
    first, second = module.updates[0]["weights"], module.updates[1]["weights"]
    assert all(torch.equal(a, b) for a, b in zip(first, module.initial))
    assert not all(torch.equal(a, b) for a, b in zip(second, module.initial))


def test_the_trainers_correction_is_the_librarys_on_the_advantage_modules_tensors():
    cfg = {"rollout_is": "token", "rollout_is_threshold": "0.7_1.5", "rollout_rs": "seq_mean_k3",
           "rollout_rs_threshold": 0.002}
    module = make(ppo={"off_policy_steps": 2, "rollout_dtype": "bfloat16", "rollout_correction": cfg,
                       "lr": 0.01}, actor={"recompute_logprob": True})
    module.__class__ = Recorder
    fit(module, 6)
    uncorrected = copy.copy(module.loss_fn)
    uncorrected.rollout_correction = None
    checked = 0
    for u in module.updates:
        batch, out = u["batch"], u["out"]
        rollout = torch.roll(batch["rollout_logprobs"], -1, 1) * out["loss_mask"]
        torch.testing.assert_close(out["rollout_logprobs"], rollout)  # aligned by the module
        want = rollout_correction(out["logprobs"], rollout, out["loss_mask"], **cfg)
        # the trainer's loss corrects its policy term from the three log-prob streams, as
        # the library's rollout_correction does (its weights and rejection passed in)
        current = out["logprobs"] + 0.05 * out["loss_mask"]
        args = (current, out["logprobs"], out["advantages"], out["loss_mask"])
        got = module.loss_fn(*args, rollout_logprobs=rollout)["loss"]
        expected = uncorrected(*args, rollout_is_weights=want.weights,
                               rollout_rs_mask=want.loss_mask)["loss"]
        torch.testing.assert_close(got, expected)
        checked += int(bool((want.weights != out["loss_mask"]).any()))
    assert checked > 0  # the weights were not all 1: the bf16 sampler and the queue differ


@pytest.mark.parametrize("dtype, far", [("bfloat16", True), (None, False)])
def test_a_bf16_sampler_is_a_real_mismatch(dtype, far):
    module = make(ppo={"rollout_dtype": dtype, "rollout_kl_coef": 0.01},
                  actor={"recompute_logprob": True})
    with torch.no_grad():  # a trained-looking policy (the initial LM head is 0: uniform)
        for p in module.policy.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.3)
    groups = module.rollout([0, 1, 2, 3], generator(0, "rollout", 0, 0))
    batch, _ = module.make_batch(groups)
    mask = torch.roll(batch["loss_mask"], -1, 1) > 0
    rollout = torch.roll(batch["rollout_logprobs"], -1, 1)[mask]
    old = batch["prox_logp"][mask]
    gap = (old - rollout).abs().max().item()
    assert (gap > 1e-3) if far else (gap < 1e-4), gap


def test_rollout_logprobs_are_those_of_the_distribution_sampled_from(tiny_lm):
    policy = build_hf_policy(PolicyConfig(pretrained=tiny_lm), seed=0).eval()
    module = PPOModule(policy=PolicyConfig(pretrained=tiny_lm), task=TaskConfig(name="reverse"),
                       ppo=PPOConfig(**SMALL, max_new_tokens=4, top_k=5, top_p=0.8,
                                     temperature=0.7), seed=0)
    params = SamplingParams(0.7, 5, 0.8)
    groups = policy.generate(module.runtime, GenerationRequest([0, 1], 2, 4, params),
                             torch.Generator().manual_seed(0))
    for ep in (ep for g in groups for ep in g):
        ids = torch.tensor([ep.tokens])
        logits, _ = policy(ids)
        for t in (i for i, g in enumerate(ep.generated) if g):
            scaled = logits[0, t - 1:t].float() / 0.7
            full = torch.log_softmax(scaled, -1)[0, ep.tokens[t]].item()
            for warper in _warpers(params):
                scaled = warper(None, scaled)
            sampled = torch.log_softmax(scaled, -1)[0, ep.tokens[t]].item()
            assert ep.logprobs[t] == pytest.approx(full, abs=1e-4)
            assert ep.rollout_logprobs[t] == pytest.approx(sampled, abs=1e-4)
            assert ep.rollout_logprobs[t] >= ep.logprobs[t] - 1e-6  # renormalized over fewer tokens


@pytest.mark.parametrize("correction, actor", [
    (TIS, {"recompute_logprob": True}),
    ({"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"}, {"recompute_logprob": True}),
    ({"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.99_1.01"}, {"recompute_logprob": True}),
    ({"bypass_mode": True, "loss_type": "reinforce", "rollout_is": "sequence",
      "rollout_is_threshold": 3.0}, {}),
    ({"bypass_mode": True, "rollout_rs": "token_k2", "rollout_rs_threshold": 0.01}, {}),
])
def test_every_mode_trains_and_logs_offpolicy_metrics(correction, actor, tmp_path):
    module = make(ppo={"off_policy_steps": 1, "rollout_dtype": "bfloat16",
                       "rollout_correction": correction}, actor=actor)
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=4, log_every_n_steps=1,
                         logger=pl.loggers.CSVLogger(tmp_path), enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module)
    logged = trainer.logged_metrics
    assert float(logged["offpolicy/staleness_mean"]) == 1.0
    assert {"offpolicy/mismatch_kl_k3", "offpolicy/chi2_token", "offpolicy/ess"} <= set(logged)
    if correction.get("rollout_rs"):
        assert "offpolicy/rejected_frac" in logged


def test_a_checkpoint_says_its_queue_is_not_restored():
    queue = RolloutQueue(3)
    for step in range(2):
        assert queue.exchange(QueuedRollout([], [], None, version=step)) is None
    state = queue.state()
    assert state == {"delay": 3, "queued": 2, "versions": [0, 1]}
    fresh = RolloutQueue(3)
    with pytest.warns(UserWarning, match=r"ppo.off_policy_steps: the checkpoint was saved with 2 "
                                         r"queued rollouts .* starts with an empty queue"):
        fresh.restore(state)
    assert len(fresh) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fresh.restore({"delay": 3, "queued": 0, "versions": []})


def test_the_module_saves_the_queue_state():
    module = make(ppo={"off_policy_steps": 2})
    module.rollout_queue.exchange(QueuedRollout([], [], None, version=0))
    checkpoint = {}
    module.on_save_checkpoint(checkpoint)
    assert checkpoint["lightning_adv"]["rollout_queue"]["queued"] == 1


def test_the_trainers_loss_takes_the_ppo_settings():
    module = make(ppo={"policy_loss": "cispo", "clip_eps_high": 4.0, "kl_loss_estimator": "k3+",
                       "use_bias_correction_kl": True, "rollout_kl_coef": 0.1,
                       "rollout_kl_estimator": "k1+"})
    loss = module.loss_fn
    assert isinstance(loss, PPOLoss)
    assert (loss.policy_loss, loss.clip_eps_high, loss.kl_estimator) == ("cispo", 4.0, "k3+")
    assert (loss.use_bias_correction_kl, loss.rollout_kl_coef, loss.rollout_kl_estimator) == \
        (True, 0.1, "k1+")
    assert loss.rollout_correction is None and not loss.bypass_mode
    bypass = make(ppo={"rollout_correction": {"bypass_mode": True, "loss_type": "reinforce",
                                              "rollout_is": "sequence"}}).loss_fn
    assert bypass.bypass_mode and bypass.rollout_correction.loss_type == "reinforce"
    assert bypass.rollout_correction.rollout_is == "sequence"
    # decoupled mode's correction is the loss's too (from old and rollout log-probs)
    decoupled = make(ppo={"rollout_correction": TIS}, actor={"recompute_logprob": True}).loss_fn
    assert not decoupled.bypass_mode and decoupled.rollout_correction.rollout_is == "token"


@pytest.mark.parametrize("ppo, actor, match", [
    ({"rollout_correction": TIS}, {}, r"^ppo.rollout_correction: decoupled mode .* "
                                      r"actor.recompute_logprob: true"),
    ({"rollout_correction": {"bypass_mode": True}}, {"recompute_logprob": True},
     r"^actor.recompute_logprob: bypass mode"),
    ({"rollout_correction": {"rollout_is": "token", "rollout_is_threshold": "2_0.5"}},
     {"recompute_logprob": True}, r"^ppo.rollout_correction.rollout_is_threshold"),
    ({"rollout_correction": {"rollout_rs": "seq_k2", "rollout_rs_threshold": 1.0}},
     {"recompute_logprob": True}, r"^ppo.rollout_correction.rollout_rs"),
    ({"rollout_correction": {"rollout_rs": "token_k2"}}, {"recompute_logprob": True},
     r"^ppo.rollout_correction.rollout_rs_threshold"),
    ({"rollout_correction": {"rollout_is": "token", "bypass_mode": True}}, {},
     r"^ppo.rollout_correction.rollout_is: .*twice"),
    ({"rollout_correction": {"tis": True}}, {}, r"^ppo.rollout_correction: unknown keys"),
    ({"off_policy_steps": -1}, {}, r"^ppo.off_policy_steps"),
    ({"rollout_dtype": "bf16"}, {}, r"^ppo.rollout_dtype"),
    ({"policy_loss": "ppo2"}, {}, r"^ppo.policy_loss: expected one of vanilla"),
    ({"policy_loss": "sapo", "policy_loss_kwargs": {"tau_pos": -1.0}}, {},
     r"^ppo.policy_loss_kwargs.tau_pos"),
    ({"policy_loss": "dro"}, {}, r"^ppo.policy_loss_kwargs: .*dro_beta"),
    ({"policy_loss": "gspo", "dual_clip": 3.0}, {}, r"^ppo.dual_clip: expected None with policy_loss 'gspo'"),
    ({"kl_loss_estimator": "k2+"}, {}, r"^ppo.kl_loss_estimator"),
    ({"rollout_kl_coef": -0.1}, {}, r"^ppo.rollout_kl_coef"),
])
def test_bad_off_policy_settings_name_the_key_before_training(ppo, actor, match):
    with pytest.raises(ValueError, match=match):
        TrainerPlan.build({"task": {"name": "reverse"}, "ppo": {**SMALL, **ppo}, "actor": actor})


@pytest.mark.parametrize("config", ["async_grpo.yaml", "async_ppo.yaml"])
def test_the_async_configs_run(config, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "lightning_adv", "fit", "--config", str(REPO / "configs" / config),
         "--trainer.limit_train_batches=6", f"--trainer.default_root_dir={tmp_path}",
         f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.callbacks=[]",
         "--trainer.enable_checkpointing=false", "--model.ppo.prompts_per_step=4",
         "--model.ppo.n_samples=4", "--model.ppo.minibatches=2"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
