"""``PPOModule``: PPO for a tiny causal transformer (or a Hugging Face model), in one
LightningModule; on-policy, or off-policy (:mod:`~lightning_adv.trainer.rollout.off_policy`).

A training step, top to bottom (:meth:`PPOModule.training_step`):

1. **rollout**: sample ``ppo.n_samples`` episodes for each of this rank's prompts
   (one prompt group each), the environment answering between turns;
2. **score**: task rewards, process rewards (``prm``), then one forward pass of the
   policy (values) and of the frozen reference (``ref_logp``) over the SPEC §1 batch
   (over ``ppo.forward_batch_size`` rows at a time when set);
3. **advantages**: the configured ``AdvantageModule`` (``actor``) turns the batch into
   aligned advantages, returns, loss mask and old log-probs;
4. **update**: ``ppo.epochs`` x ``ppo.minibatches`` optimizer steps (manual
   optimization) on :class:`~lightning_adv.PPOLoss` (clipped policy loss, value loss,
   entropy bonus, optional KL term; ``ppo.loss_agg_mode`` aggregation), each over
   gradient-accumulating micro-batches of ``ppo.micro_batch_size`` rows when set;
5. **log**: :class:`~lightning_adv.AdvantageMetrics` and the episode metrics, a
   histogram of advantages, every ``sample_log.every_n_steps`` steps a few responses as
   text and as advantage heatmaps (:mod:`~lightning_adv.trainer.logs.heatmap_log`); the KL
   controller takes the step's KL.

Every random draw of a step comes from generators seeded by (seed, step, rank) (the
prompt order by (seed, epoch), the initial weights by the seed), so a resumed run
reproduces the next step exactly.

This module holds the LightningModule's hooks; the parts live beside it: the config
sections (:mod:`~lightning_adv.trainer.config`), the setup checks (one
:class:`~lightning_adv.trainer.setup.TrainerPlan`, also the CLI's pre-flight check), steps
1-2 (:mod:`~lightning_adv.trainer.rollout.step`) and step 4 (:mod:`~lightning_adv.trainer.update`).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Optional

import lightning.pytorch as pl
import torch
from torch import Tensor, nn

from lightning_adv.metrics.advantage_metrics import AdvantageMetrics
from lightning_adv.config import ActorConfig
from lightning_adv.distributed import report_failure
from lightning_adv.losses.kl_controllers import KLControllerConfig
from lightning_adv.batch.grouping import BatchMeta
from lightning_adv.trainer.config import PPOConfig, PRMConfig
from lightning_adv.trainer.data import PromptDataset, PromptLoader, PromptSampler, generator
from lightning_adv.trainer.logs.evaluation import (
    STAGES as EVAL_STAGES, EvalConfig, EvalMetrics, held_out_loader, prediction_records)
from lightning_adv.trainer.logs.heatmap_log import HeatmapLog
from lightning_adv.trainer.logs.metrics import StepMetrics, episode_kl, log_histogram, logging_due
from lightning_adv.trainer.rollout.off_policy import (
    QueuedRollout, mean_task_reward, off_policy_batch, off_policy_parts, record_off_policy)
from lightning_adv.trainer.policies.config import PolicyConfig
from lightning_adv.trainer.run.resume import reconcile_checkpoint
from lightning_adv.trainer.rollout.step import BatchKeys, Rollout, sample_until_signal
from lightning_adv.trainer.rollout.vine import StepValueSampling
from lightning_adv.trainer.logs.sample_log import (
    SampleLogConfig, evaluation_log_step, log_text, samples_markdown)
from lightning_adv.trainer.setup import TrainerPlan
from lightning_adv.trainer.policies.sharding import ShardingHooks  # (registers --trainer.strategy=fsdp2)
from lightning_adv.trainer.tasks.runtime import TaskConfig
from lightning_adv.trainer.update import Updater, check_advantages


class PPOModule(ShardingHooks, pl.LightningModule):
    """PPO-family trainer of a tiny causal transformer on a built-in (or your) task.

    Args:
        actor: advantage settings and the stage tree (SPEC §2), as in ``AdvantageModule``.
        policy: the policy network (and whether it has a value head).
        ppo: rollout and optimization settings.
        task: the task, its prompt pool and an optional replacement reward function.
        prm: process scorers and the call-time process shaping.
        advantage_module: dotted path of the ``AdvantageModule`` (sub)class to use.
        seed: seed of every random draw of a step (null: the run's ``seed_everything``).
        kl_controller: drives the reward-side KL coefficient, starting at ``actor.kl_ctl``:
            ``fixed`` or ``adaptive`` (Ziegler et al. 2019, with ``target`` and ``horizon``).
        evaluation: held-out prompts of ``validate``, ``test``, ``predict`` and of validation
            during ``fit`` (greedy reward, pass@k).
        sample_log: a few responses logged as text and as advantage heatmaps every N
            training steps.
    """

    def __init__(self, *, actor: ActorConfig = ActorConfig(), policy: PolicyConfig = PolicyConfig(),
                 ppo: PPOConfig = PPOConfig(), task: TaskConfig = TaskConfig(),
                 prm: PRMConfig = PRMConfig(),
                 advantage_module: str = "lightning_adv.AdvantageModule",
                 seed: Optional[int] = None,
                 kl_controller: KLControllerConfig = KLControllerConfig(),
                 evaluation: EvalConfig = EvalConfig(),
                 sample_log: SampleLogConfig = SampleLogConfig()):
        super().__init__()
        self.automatic_optimization = False
        plan = TrainerPlan.for_module(dict(
            actor=actor, policy=policy, ppo=ppo, task=task, prm=prm,
            advantage_module=advantage_module, seed=seed, kl_controller=kl_controller,
            evaluation=evaluation, sample_log=sample_log))
        self.actor_config, self.policy_config, self.ppo_config = plan.actor, plan.policy, plan.ppo
        self.task_config, self.prm_config = plan.task, plan.prm
        self.kl_controller_config = plan.kl_controller
        self.eval_config, self.sample_log_config = plan.evaluation, plan.sample_log
        self.heatmap_log = HeatmapLog(plan.sample_log, plan.runtime.vocab)
        self.save_hyperparameters(plan.hparams)
        self._seed = seed
        self.runtime, self.max_new_tokens = plan.runtime, plan.max_new_tokens
        self.advantage = plan.advantage
        self.policy, self.ref_policy = plan.build_policies(self.seed)
        self.critic = self.policy_config.value_head
        self.scorers = plan.scorers
        self.rollouts = Rollout(self.policy, self.ref_policy, self.runtime, self.ppo_config,
                                scorers=self.scorers, keys=BatchKeys(
                                    self.critic, self.actor_config.recompute_logprob,
                                    self.advantage.required_batch_keys),
                                vine=StepValueSampling(self.ppo_config.vine, self.actor_config)
                                if self.ppo_config.vine is not None else None)
        """sampling, scoring and batching (:class:`~lightning_adv.trainer.rollout.step.Rollout`)"""
        self.prm_shaping = plan.prm_shaping
        self.kl_controller = self.kl_controller_config.build(self.actor_config.kl_ctl)
        self.loss_fn = plan.loss
        self.updater = Updater(self.policy, self.loss_fn, self.ppo_config, self.critic)
        self.metrics = StepMetrics(critic=self.critic, vine=self.ppo_config.vine is not None)
        self.adv_metrics = AdvantageMetrics(prefix="train/", dist_sync_on_step=False)
        self.eval_metrics = nn.ModuleDict({stage: EvalMetrics(self.eval_config.pass_k)
                                           for stage in EVAL_STAGES})
        self.offpolicy_metrics, self.rollout_queue, self.rollout_copy = off_policy_parts(
            self.ppo_config)
        self.rollout_step = 0
        """training steps (rollouts) done so far; seeds the next step's generators, and is
        the policy version of what this step samples"""
        self.reward_history: list[float] = []
        """mean task reward of each training step of this process (for the run summary)"""
        self.sampled_tokens = 0
        """tokens sampled for the run's trained episodes so far, over all ranks
        (``train/sampled_tokens_total``; :class:`~.run.callbacks.SampledTokenBudget`)"""
        self._loader: Optional[PromptLoader] = None

    # ------------------------------------------------------------------ Lightning hooks

    @property
    def seed(self) -> int:
        """Explicit ``seed``, else the ``seed_everything`` value of the run, else 0."""
        if self._seed is not None:
            return self._seed
        return int(os.environ.get("PL_GLOBAL_SEED", 0))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.policy.parameters() if p.requires_grad]
        # The fused kernel updates all parameters in one pass: the same update (to float
        # rounding, ~1e-7 after hundreds of steps), about twice as fast on CPU. Lightning's
        # mixed precision refuses to clip the gradients of a fused optimizer.
        mixed = "mixed" in str(getattr(self._trainer, "precision", "") or "")
        return torch.optim.AdamW(params, lr=self.ppo_config.lr,
                                 weight_decay=self.ppo_config.weight_decay,
                                 fused=self.device.type in ("cpu", "cuda") and not mixed)

    def train_dataloader(self) -> PromptLoader:
        dataset = PromptDataset(self.runtime.num_prompts)
        sampler = PromptSampler(dataset, self.ppo_config.prompts_per_step,
                                num_replicas=self.trainer.world_size,
                                rank=self.trainer.global_rank, seed=self.seed)
        rows = sampler.per_rank * self.ppo_config.n_samples
        if rows < self.ppo_config.minibatches:
            raise ValueError(f"ppo.minibatches: {self.ppo_config.minibatches} minibatches need at "
                             f"least as many rows per rank, got {rows} (prompts_per_step / ranks "
                             f"* n_samples)")
        self._loader = PromptLoader(dataset, sampler)
        return self._loader

    def setup(self, stage: str) -> None:
        # The checkpoint's hyper-parameters carry the seed the run used, so that
        # ``PPOModule.load_from_checkpoint(path)`` rebuilds the same module.
        self.hparams["seed"] = self.seed

    def on_train_start(self) -> None:
        # A resumed run restored the optimizer's param groups from the checkpoint; the
        # config's values win (docs/guides/cli-trainer.md, "Runs").
        for group in self.optimizers().optimizer.param_groups:
            group["lr"] = self.ppo_config.lr
            group["weight_decay"] = self.ppo_config.weight_decay

    def on_fit_start(self) -> None:
        self.policy.check_device(self.device)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["lightning_adv"] = {"rollout_step": self.rollout_step, "seed": self.seed,
                                       "rollout_queue": self.rollout_queue.state(),
                                       "sampled_tokens": self.sampled_tokens}
        self.save_hf_model()

    def on_train_end(self) -> None:
        self.save_hf_model()

    @property
    def hf_model_dir(self) -> Optional[str]:
        """Where the policy is exported: ``<run directory>/<policy.export_name>``
        (``hf_model`` for a Hugging Face policy; None for a policy with no export)."""
        name = self.policy.export_name
        if name is None or self._trainer is None:
            return None
        return os.path.join(self.trainer.log_dir or self.trainer.default_root_dir, name)

    def save_hf_model(self) -> None:
        """Export the policy (rank 0; a Hugging Face one with ``save_pretrained``), with each
        checkpoint and at the end of fit:
        ``AutoModelForCausalLM.from_pretrained(<run directory>/hf_model)``."""
        directory = self.hf_model_dir
        if directory is not None:
            self.policy.export(directory, self.trainer)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        reconcile_checkpoint(checkpoint, self.state_dict(), dict(self.hparams))
        state = checkpoint.get("lightning_adv", {})
        self.rollout_step = int(state.get("rollout_step", 0))
        self.sampled_tokens = int(state.get("sampled_tokens", 0))
        self.rollout_queue.restore(state.get("rollout_queue"))
        saved = state.get("seed")
        if saved is not None and int(saved) != self.seed:
            warnings.warn(f"seed: the checkpoint was trained with seed {saved}, this run uses "
                          f"{self.seed}; the resumed steps will not reproduce the original run",
                          stacklevel=2)

    # ------------------------------------------------------------------ evaluation

    def val_dataloader(self) -> Any:
        return held_out_loader("val", self.runtime.num_prompts, self.eval_config,
                               self.runtime.task.pool_size) if self.eval_config.num_prompts else []

    def test_dataloader(self) -> Any:
        return held_out_loader("test", self.runtime.num_prompts, self.eval_config,
                               self.runtime.task.pool_size) if self.eval_config.num_prompts else []

    def predict_dataloader(self) -> Any:
        return self.test_dataloader()

    def validation_step(self, batch: Tensor, batch_idx: int) -> None:
        self._evaluation_step(batch, batch_idx, "val")

    def test_step(self, batch: Tensor, batch_idx: int) -> None:
        self._evaluation_step(batch, batch_idx, "test")

    def predict_step(self, batch: Tensor, batch_idx: int) -> list[dict[str, Any]]:
        return prediction_records(*self.evaluate(batch.tolist(), "predict", batch_idx))

    @torch.no_grad()
    def evaluate(self, indices: list[int], stage: str, batch_idx: int
                 ) -> tuple[list[list[Any]], list[list[Any]]]:
        """One greedy and ``evaluation.n_samples`` sampled episodes per prompt, scored."""
        gen = generator(self.seed, "eval", stage, batch_idx, self.global_rank)
        return self.rollouts.evaluate(indices, self.eval_config.n_samples, gen)

    def _evaluation_step(self, batch: Tensor, batch_idx: int, stage: str) -> None:
        greedy, sampled = self.evaluate(batch.tolist(), stage, batch_idx)
        metrics = self.eval_metrics[stage]
        metrics.update(greedy, sampled, self.eval_config.success_threshold)
        for name, metric in metrics.items():
            self.log(f"{stage}/{name}", metric, on_step=False, on_epoch=True, batch_size=len(greedy))
        if batch_idx == 0 and self.sample_log_config.every_n_steps:
            step = evaluation_log_step(self)  # that of the stage's scalars
            log_text(self, f"{stage}/samples",
                     samples_markdown(greedy, self.sample_log_config.count), step)
            self.heatmap_log.evaluation(self, stage, greedy, sampled, step)

    # ------------------------------------------------------------------ the training step

    def training_step(self, batch: Tensor, batch_idx: int) -> None:
        step, rank = self.rollout_step, self.global_rank
        try:
            fresh, entry = self.sample_step(batch.tolist(), step, rank)
            if entry is not None:
                rollout, meta = self.make_batch(entry.groups, entry.baselines)
                if self.ppo_config.off_policy:
                    rollout = off_policy_batch(
                        rollout, self.ppo_config, step, step - entry.version,
                        "rollout_is_weights" in self.advantage.optional_batch_keys)
        except Exception:
            # A task function failing on this rank only: the other ranks are about to wait
            # in the advantage module's collectives; let them fail too.
            report_failure(self.device)
            raise
        if entry is not None:  # (None: the off-policy queue is still filling)
            out = self.advantage(rollout, meta, prm=self.prm_shaping,
                                 kl_coef=self.kl_controller.value)
            check_advantages(out, self.advantage, step, self)
            if self.ppo_config.off_policy:
                record_off_policy(self.offpolicy_metrics, out, self.ppo_config,
                                  step - entry.version)
            self.updater.step(rollout, out, generator(self.seed, "minibatches", step, rank), self)
            self.log_step(rollout, out, meta, entry.groups, fresh.sampled)  # fresh rewards
            self._update_kl_controller(out)
        self.rollout_step += 1
        if self._loader is not None:
            self._loader.step_done(self.current_epoch)

    def sample_step(self, indices: list[int], step: int, rank: int
                    ) -> tuple[QueuedRollout, Optional[QueuedRollout]]:
        """This step's rollout (with ReMax's greedy baselines), and the one to train on:
        itself, or under ``ppo.off_policy_steps`` the one sampled that many steps ago
        (None while the queue fills: then only the fresh rollout's reward is logged)."""
        groups, sampled = self.sample_groups(indices, step, rank)
        baselines = None
        if self.ppo_config.greedy_baseline:
            baselines = self.rollouts.greedy_rewards([g[0].index for g in groups])
            self.log("train/greedy_reward", sum(baselines) / len(baselines), on_step=True,
                     on_epoch=False, batch_size=len(baselines), sync_dist=True)
        fresh = QueuedRollout(groups, sampled, baselines, version=step)
        ready = self.rollout_queue.exchange(fresh)  # (off_policy_steps 0: fresh itself)
        if ready is None:  # (log_step's arguments: Lightning refuses others for one key)
            self.log("train/task_reward", mean_task_reward(sampled), prog_bar=True, on_step=True,
                     on_epoch=False, batch_size=sum(map(len, sampled)))
        return fresh, ready

    def sample_groups(self, indices: list[int], step: int,
                      rank: int) -> tuple[list[list[Any]], list[list[Any]]]:
        """The step's prompt groups to train on, and the groups of its first round (the
        loader's prompts, an unbiased sample for the reward metrics); with
        ``ppo.dynamic_sampling`` only groups whose rewards differ are kept."""
        gen = generator(self.seed, "rollout", step, rank)
        dynamic = self.ppo_config.dynamic_sampling
        if not dynamic.enabled:
            groups = self.rollout(indices, gen)
            return groups, groups
        result = sample_until_signal(
            lambda idx: self.rollout(idx, gen), indices, self.runtime.num_prompts,
            generator(self.seed, "dynamic_sampling", step, rank), dynamic.max_rounds, step)
        self.log_dict({"train/dynamic_filtered_fraction": result.filtered_fraction,
                       "train/dynamic_rounds": float(result.rounds)}, on_step=True,
                      on_epoch=False, batch_size=len(indices), sync_dist=True)
        return result.groups, result.first_round

    def rollout(self, indices: list[int], gen: torch.Generator) -> list[list[Any]]:
        """Sample and score ``n_samples`` episodes for each prompt index (with
        ``ppo.rollout_dtype``'s sampler copy when set)."""
        sampler = self.rollout_copy(self.policy) if self.rollout_copy is not None else None
        return self.rollouts.sample(indices, gen, sampler)

    def make_batch(self, groups: list[list[Any]],
                   reward_baselines: Optional[list[float]] = None) -> tuple[dict[str, Any], BatchMeta]:
        """The SPEC §1 batch of ``groups`` with the scoring passes' keys
        (:meth:`~lightning_adv.trainer.rollout.step.Rollout.batch`)."""
        return self.rollouts.batch(groups, self.device, reward_baselines)

    @torch.no_grad()
    def log_step(self, batch: dict[str, Any], out: dict[str, Any], meta: BatchMeta,
                 groups: list[list[Any]], sampled: Optional[list[list[Any]]] = None) -> None:
        """``sampled``: the groups whose rewards ``train/task_reward`` reports (default
        ``groups``; under dynamic sampling the first round's, unfiltered)."""
        self.metrics.update_step(batch, out, groups, sampled or groups)
        values = self.metrics.compute()  # (collective; the reward is reported every step)
        n = sum(len(group) for group in groups)
        reward = values.pop("train/task_reward")
        self.sampled_tokens += int(values["train/sampled_tokens"])
        values["train/sampled_tokens_total"] = torch.tensor(float(self.sampled_tokens))
        self.reward_history.append(float(reward))
        self.log("train/task_reward", reward, prog_bar=True, on_step=True, on_epoch=False,
                 batch_size=n)
        if logging_due(self.trainer):  # (every rank alike: the step counters agree)
            self.adv_metrics.update(out, meta)
            values.update(self.adv_metrics.compute())
            if self.ppo_config.off_policy:
                values.update(self.offpolicy_metrics.compute())
            values["train/kl_coef"] = torch.tensor(self.kl_controller.value)
            self.log_dict(values, on_step=True, on_epoch=False, batch_size=n)
            log_histogram(self.logger, self.global_rank, self.rollout_step,
                          "train/advantages", out["advantages"][out["loss_mask"] > 0])
        self.adv_metrics.reset()  # (the update's loss diagnostics, logged or not)
        self.offpolicy_metrics.reset()
        if self.sample_log_config.due(self.rollout_step):
            log_text(self, "train/samples", samples_markdown(groups, self.sample_log_config.count),
                     self.rollout_step)
            self.heatmap_log.training(self, batch, out, groups)

    @torch.no_grad()
    def _update_kl_controller(self, out: dict[str, Any]) -> None:
        """Feed the controller the step's KL to the reference (:func:`episode_kl`)."""
        if self.kl_controller_config.type != "fixed" and out.get("ref_logp") is not None:
            self.kl_controller.update(*episode_kl(out))  # (kl, episodes)
