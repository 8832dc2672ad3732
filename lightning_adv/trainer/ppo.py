"""``PPOModule``: on-policy PPO for a tiny causal transformer, in one LightningModule.

A training step, top to bottom (:meth:`PPOModule.training_step`):

1. **rollout**: sample ``ppo.n_samples`` episodes for each of this rank's prompts
   (one prompt group each), the environment answering between turns;
2. **score**: task rewards, process rewards (``prm``), then one forward pass of the
   policy (values) and of the frozen reference (``ref_logp``) over the SPEC §1 batch;
3. **advantages**: the configured ``AdvantageModule`` (``actor``) turns the batch into
   aligned advantages, returns, loss mask and old log-probs;
4. **update**: ``ppo.epochs`` x ``ppo.minibatches`` optimizer steps (manual
   optimization) on the clipped policy loss, the value loss and the entropy bonus, each
   a token mean over the aligned loss mask;
5. **log**: torchmetrics means over active tokens, a histogram of advantages.

Every random draw of a step comes from generators seeded by (seed, step, rank) (the
prompt order by (seed, epoch), the initial weights by the seed), so a
resumed run reproduces the next step exactly.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from torch import Tensor

from lightning_adv.validators import check_bool, check_choice, check_int, check_number, fail
from lightning_adv.config import (
    PRM_MODES, ActorConfig, PRMAdvantageShapingConfig, check_gvpo_kwargs, check_json_kwargs,
    check_process_mode, is_dotted_path)
from lightning_adv.distributed import report_failure
from lightning_adv.meta import BatchMeta
from lightning_adv.module import AdvantageModule
from lightning_adv.dotted_path import import_object, resolve_callable
from lightning_adv.trainer.data import (
    PromptDataset, PromptLoader, PromptSampler, derive_seed, generator)
from lightning_adv.trainer.metrics import StepMetrics
from lightning_adv.trainer.policy import CausalTransformer, PolicyConfig, entropy, next_token_logprobs
from lightning_adv.trainer.sampling import build_batch, finite_or_raise, generate, score
from lightning_adv.trainer.tasks import TaskConfig, TaskRuntime


@dataclass(frozen=True)
class PPOConfig:
    """Rollout and optimization settings of one training step."""

    prompts_per_step: int = 32
    """prompts per training step, over all ranks (each rank takes an equal share)"""
    n_samples: int = 8
    """responses sampled per prompt: one prompt group, never split across ranks"""
    max_new_tokens: Optional[int] = None
    """token limit of one policy turn (null: the task's default)"""
    temperature: float = 1.0
    """sampling temperature; log-probs in the loss use the same temperature"""
    epochs: int = 2
    """PPO epochs over each rollout batch"""
    minibatches: int = 4
    """minibatches per PPO epoch, one optimizer step each"""
    clip_eps: float = 0.2
    """clip range of the probability ratio"""
    value_clip_eps: Optional[float] = 0.2
    """clip range of value updates around the rollout values (null: unclipped value loss)"""
    lr: float = 1e-3
    """Adam learning rate"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    value_coef: float = 0.5
    """weight of the value loss"""
    entropy_coef: float = 0.0
    """weight of the entropy bonus"""
    max_grad_norm: Optional[float] = 1.0
    """gradient clipping by global norm (null: no clipping)"""
    bootstrap_truncated: bool = False
    """bootstrap rows cut by the token limit from the critic's value after their last token
    (AReaL's behaviour; no loss ever trains that value); false: the limit ends the episode,
    so the value after its last token is 0"""

    def __post_init__(self) -> None:
        for name in ("prompts_per_step", "n_samples", "epochs", "minibatches"):
            check_int(f"ppo.{name}", getattr(self, name))
        if self.max_new_tokens is not None:
            check_int("ppo.max_new_tokens", self.max_new_tokens)
        for name in ("temperature", "clip_eps", "lr"):
            check_number(f"ppo.{name}", getattr(self, name), positive=True)
        for name in ("weight_decay", "value_coef", "entropy_coef"):
            check_number(f"ppo.{name}", getattr(self, name), minimum=0.0)
        check_bool("ppo.bootstrap_truncated", self.bootstrap_truncated)
        for name in ("value_clip_eps", "max_grad_norm"):
            if getattr(self, name) is not None:
                check_number(f"ppo.{name}", getattr(self, name), positive=True)


@dataclass(frozen=True)
class ScorerSpec:
    """One process scorer: ``fn(sample, **kwargs)`` -> one value per generated token or turn."""

    path: str
    """dotted path of the scorer function (lightning_adv.trainer.tasks.position_match)"""
    weight: float = 1.0
    """multiplies the scorer's values; the weighted values of all scorers are summed"""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """keyword arguments of the scorer"""


@dataclass(frozen=True)
class PRMConfig:
    """Process rewards: scorers feeding ``token_rewards``, and the call-time shaping mode."""

    enabled: bool = False
    """run the scorers and pass token_rewards (and advantage_shaping) to the advantage module"""
    advantage_shaping: PRMAdvantageShapingConfig = field(default_factory=PRMAdvantageShapingConfig)
    """call-time process shaping (mode and GVPO values); an explicit actor.advantage.process_adv_shaping wins"""
    scorers: list[ScorerSpec] = field(default_factory=list)
    """process scorers, summed with their weights"""

    def __post_init__(self) -> None:
        check_bool("prm.enabled", self.enabled)
        shaping = self.advantage_shaping
        if isinstance(shaping, Mapping):
            shaping = PRMAdvantageShapingConfig(**shaping)
            object.__setattr__(self, "advantage_shaping", shaping)
        scorers = [ScorerSpec(**s) if isinstance(s, Mapping) else s for s in self.scorers]
        object.__setattr__(self, "scorers", scorers)
        for i, spec in enumerate(scorers):
            key = f"prm.scorers[{i}]"
            if not (isinstance(spec.path, str) and is_dotted_path(spec.path)):
                fail(f"{key}.path", "a dotted function path (my_pkg.scorers.fn)", spec.path)
            check_number(f"{key}.weight", spec.weight)
            check_json_kwargs(f"{key}.kwargs", spec.kwargs)
        if self.enabled:
            check_choice("prm.advantage_shaping.mode", shaping.mode, PRM_MODES)
            check_gvpo_kwargs("prm.advantage_shaping", shaping.gvpo_kwargs())
            if not scorers:
                raise ValueError("prm.scorers: prm.enabled is true but no scorer is configured")


def _as(cls: type, value: Any, key: str) -> Any:
    """A config dataclass from itself or a mapping (hparams of a checkpoint are mappings)."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise ValueError(f"{key}: unknown keys {unknown}; expected some of {sorted(names)}")
        return cls(**value)
    raise TypeError(f"{key}: expected a {cls.__name__} or a mapping, got {type(value).__name__}")


def build_advantage_module(path: str, actor: ActorConfig) -> AdvantageModule:
    """Import the ``advantage_module`` class, check it, and build it (resolving stages)."""
    cls = import_object(path, "advantage_module") if is_dotted_path(path) else None
    if not (isinstance(cls, type) and issubclass(cls, AdvantageModule)):
        raise ValueError(f"advantage_module: expected the dotted path of an AdvantageModule "
                         f"subclass, got {path!r}" + (f" ({cls!r})" if cls is not None else ""))
    return cls(actor)


class PPOModule(pl.LightningModule):
    """PPO-family trainer of a tiny causal transformer on a built-in (or your) task.

    Args:
        actor: advantage settings and the stage tree (SPEC §2), as in ``AdvantageModule``.
        policy: the policy network (and whether it has a value head).
        ppo: rollout and optimization settings.
        task: the task, its prompt pool and an optional replacement reward function.
        prm: process scorers and the call-time process shaping.
        advantage_module: dotted path of the ``AdvantageModule`` (sub)class to use.
        seed: seed of every random draw of a step (null: the run's ``seed_everything``).
    """

    def __init__(self, actor: ActorConfig = ActorConfig(), policy: PolicyConfig = PolicyConfig(),
                 ppo: PPOConfig = PPOConfig(), task: TaskConfig = TaskConfig(),
                 prm: PRMConfig = PRMConfig(),
                 advantage_module: str = "lightning_adv.AdvantageModule",
                 seed: Optional[int] = None):
        super().__init__()
        self.automatic_optimization = False
        self.actor_config = _as(ActorConfig, actor, "actor")
        self.policy_config = _as(PolicyConfig, policy, "policy")
        self.ppo_config = _as(PPOConfig, ppo, "ppo")
        self.task_config = _as(TaskConfig, task, "task")
        self.prm_config = _as(PRMConfig, prm, "prm")
        check_trainer_options(self.actor_config, self.prm_config)
        self.save_hyperparameters({
            "actor": dataclasses.asdict(self.actor_config),
            "policy": dataclasses.asdict(self.policy_config),
            "ppo": dataclasses.asdict(self.ppo_config),
            "task": dataclasses.asdict(self.task_config),
            "prm": dataclasses.asdict(self.prm_config),
            "advantage_module": advantage_module, "seed": seed})

        self.runtime = TaskRuntime(self.task_config)
        self.max_new_tokens, max_len = sequence_budget(self.runtime, self.ppo_config,
                                                       self.policy_config)
        check_length_penalty(self.actor_config, self.runtime, self.max_new_tokens)
        vocab = self.runtime.vocab
        self._seed = seed
        # The initial weights come from the run's seed too, not from whatever the global RNG
        # holds: the same seed gives the same policy, whatever ran before.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.seed, "init"))
            self.policy = CausalTransformer(self.policy_config, len(vocab), max_len,
                                            banned_tokens=(vocab.pad_id, vocab.bos_id))
        self.critic = self.policy_config.value_head
        self.ref_policy: Optional[CausalTransformer] = None
        if self.actor_config.kl_ctl > 0:
            self.ref_policy = copy.deepcopy(self.policy)
            self.ref_policy.value_head = None
            self.ref_policy.requires_grad_(False)  # no dropout or batch norm: mode is moot
        self.advantage = build_advantage_module(advantage_module, self.actor_config)
        self.scorers = [(f"prm.scorers[{i}] {s.path!r}",
                         resolve_callable(s.path, s.kwargs, f"prm.scorers[{i}].path"),
                         float(s.weight), dict(s.kwargs))
                        for i, s in enumerate(self.prm_config.scorers)] if self.prm_config.enabled else []
        self.prm_shaping = self.prm_config.advantage_shaping if self.prm_config.enabled else None
        self.metrics = StepMetrics(critic=self.critic)
        self.rollout_step = 0
        """training steps (rollouts) done so far; seeds the next step's generators"""
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
        return torch.optim.AdamW(params, lr=self.ppo_config.lr,
                                 weight_decay=self.ppo_config.weight_decay)

    def train_dataloader(self) -> PromptLoader:
        dataset = PromptDataset(self.task_config.num_prompts)
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

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["lightning_adv"] = {"rollout_step": self.rollout_step, "seed": self.seed}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("lightning_adv", {})
        self.rollout_step = int(state.get("rollout_step", 0))
        saved = state.get("seed")
        if saved is not None and int(saved) != self.seed:
            warnings.warn(f"seed: the checkpoint was trained with seed {saved}, this run uses "
                          f"{self.seed}; the resumed steps will not reproduce the original run",
                          stacklevel=2)

    # ------------------------------------------------------------------ the training step

    def training_step(self, batch: Tensor, batch_idx: int) -> None:
        step, rank = self.rollout_step, self.global_rank
        try:
            groups = self.rollout(batch.tolist(), generator(self.seed, "rollout", step, rank))
            rollout, meta = self.make_batch(groups)
        except Exception:
            # A task function failing on this rank only: the other ranks are about to wait
            # in the advantage module's collectives; let them fail too.
            report_failure(self.device)
            raise
        out = self.advantage(rollout, meta, prm=self.prm_shaping)
        self.update(rollout, out, generator(self.seed, "minibatches", step, rank))
        self.log_step(rollout, out, groups)
        self.rollout_step += 1
        if self._loader is not None:
            self._loader.step_done(self.current_epoch)

    @torch.no_grad()
    def rollout(self, indices: list[int], gen: torch.Generator) -> list[list[Any]]:
        """Sample and score ``n_samples`` episodes for each prompt index."""
        self.policy.eval()
        groups = generate(self.policy, self.runtime, indices, self.ppo_config.n_samples,
                          self.max_new_tokens, self.ppo_config.temperature, gen)
        self.policy.train()
        score(groups, self.runtime, self.scorers)
        return groups

    @torch.no_grad()
    def make_batch(self, groups: list[list[Any]]) -> tuple[dict[str, Any], BatchMeta]:
        """The SPEC §1 batch: episodes, then values / ref_logp / prox_logp from model passes."""
        batch, meta = build_batch(groups, multi_turn=self.runtime.task.max_turns > 1,
                                  process_rewards=bool(self.scorers))
        batch = {k: v.to(self.device) if isinstance(v, Tensor) else v for k, v in batch.items()}
        ids, attention = batch["input_ids"], batch["attention_mask"].float()
        next_real = torch.nn.functional.pad(attention[:, 1:], (0, 1))  # token t+1 exists
        temperature = self.ppo_config.temperature
        if self.critic or self.actor_config.recompute_logprob:
            logits, values = self.policy(ids)
            if self.critic:
                values = finite_or_raise(values.float(), "values") * attention
                if not self.ppo_config.bootstrap_truncated:
                    # The core bootstraps truncated rows with the value after their last
                    # token; here the token limit is terminal, so that state's value is 0.
                    last = attention.sum(1).long() - 1
                    values[torch.arange(len(last), device=values.device), last] = 0.0
                batch["values"] = values
            if self.actor_config.recompute_logprob:
                batch["prox_logp"] = next_token_logprobs(logits, ids, temperature) * next_real
        if self.ref_policy is not None:
            ref_logits, _ = self.ref_policy(ids)
            batch["ref_logp"] = next_token_logprobs(ref_logits, ids, temperature) * next_real
        return batch, meta

    def update(self, batch: dict[str, Any], out: dict[str, Any], gen: torch.Generator) -> None:
        """PPO epochs x minibatches of clipped-surrogate updates (manual optimization)."""
        cfg = self.ppo_config
        opt = self.optimizers()
        rows = batch["input_ids"].shape[0]
        lengths = batch["attention_mask"].sum(1)
        mask, old_logp = out["loss_mask"], out["logprobs"]
        advantages, returns = out["advantages"], out["returns"]
        old_values = batch.get("values")
        for _ in range(cfg.epochs):
            order = torch.randperm(rows, generator=gen).to(self.device)
            for chunk in order.tensor_split(cfg.minibatches):
                width = int(lengths[chunk].max())
                ids = batch["input_ids"][chunk, :width]
                m = mask[chunk, :width]
                logits, values = self.policy(ids)
                new_logp = next_token_logprobs(logits, ids, cfg.temperature)
                log_ratio = (new_logp - old_logp[chunk, :width]) * m
                ratio = log_ratio.exp()
                adv = advantages[chunk, :width]
                pg = torch.maximum(-adv * ratio,
                                   -adv * ratio.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps))
                ent = entropy(logits, cfg.temperature)
                scale = self._token_scale(m)
                loss = (pg * m).sum() * scale - cfg.entropy_coef * (ent * m).sum() * scale
                if self.critic:
                    ret, old_v = returns[chunk, :width], old_values[chunk, :width]
                    v_loss = (values - ret) ** 2
                    if cfg.value_clip_eps is not None:
                        clipped = old_v + (values - old_v).clamp(-cfg.value_clip_eps, cfg.value_clip_eps)
                        v_loss = torch.maximum(v_loss, (clipped - ret) ** 2)
                    v_loss = 0.5 * v_loss
                    loss = loss + cfg.value_coef * (v_loss * m).sum() * scale
                    self.metrics.update("value_loss", v_loss, m)
                opt.zero_grad()
                self.manual_backward(loss)
                if cfg.max_grad_norm is not None:
                    self.clip_gradients(opt, gradient_clip_val=cfg.max_grad_norm,
                                        gradient_clip_algorithm="norm")
                opt.step()
                with torch.no_grad():
                    self.metrics.update("policy_loss", pg, m)
                    self.metrics.update("entropy", ent, m)
                    self.metrics.update("approx_kl", (ratio - 1) - log_ratio, m)
                    self.metrics.update("clipfrac", ((ratio - 1).abs() > cfg.clip_eps).float(), m)

    def _token_scale(self, mask: Tensor) -> Tensor:
        """1 / (tokens of this minibatch over all ranks), times the world size: DDP averages
        gradients over ranks, so the loss becomes the global token mean."""
        count = mask.sum().detach()
        world = 1
        if dist.is_available() and dist.is_initialized():
            count = count.clone()
            dist.all_reduce(count)
            world = dist.get_world_size()
        return world / count.clamp(min=1.0)

    @torch.no_grad()
    def log_step(self, batch: dict[str, Any], out: dict[str, Any], groups: list[list[Any]]) -> None:
        m = out["loss_mask"]
        metrics = self.metrics
        episodes = [ep for group in groups for ep in group]
        metrics.update("task_reward", torch.tensor([ep.reward for ep in episodes]))
        metrics.update("response_length", batch["loss_mask"].sum(1).float())
        metrics.update("truncated", batch["is_truncated"].float())
        metrics.update("turns", torch.tensor([float(len(ep.turns)) for ep in episodes]))
        metrics.update("total_rewards", out["tot_rewards"], m)
        metrics.update("kl_rewards", out["kl_rewards"], m)
        if "token_rewards" in batch:
            metrics.update("process_reward", batch["token_rewards"],
                           batch["loss_mask"].float())
        metrics.update_advantages(out["advantages"], m)
        if self.critic:
            metrics.update_values(batch["values"], out["returns"], m)
        values = metrics.compute()
        n = len(episodes)
        reward = values.pop("train/task_reward")
        self.log("train/task_reward", reward, prog_bar=True, on_step=True, on_epoch=False,
                 batch_size=n)
        self.log_dict(values, on_step=True, on_epoch=False, batch_size=n)
        self._log_histogram("train/advantages", out["advantages"][m > 0])

    def _log_histogram(self, tag: str, values: Tensor) -> None:
        logger = self.logger
        every = max(1, int(getattr(self.trainer, "log_every_n_steps", 1) or 1))
        if logger is None or (self.rollout_step + 1) % every:
            return
        experiment = getattr(logger, "experiment", None)
        if self.global_rank == 0 and hasattr(experiment, "add_histogram") and values.numel():
            experiment.add_histogram(tag, values.float().cpu(), self.rollout_step)


def sequence_budget(runtime: TaskRuntime, ppo: PPOConfig, policy: PolicyConfig) -> tuple[int, int]:
    """Tokens per policy turn and the policy's sequence length; the length must fit the
    task's longest episode."""
    max_new_tokens = ppo.max_new_tokens or runtime.task.max_new_tokens
    needed = runtime.task.max_episode_len(max_new_tokens)
    if policy.max_seq_len is not None and policy.max_seq_len < needed:
        raise ValueError(f"policy.max_seq_len: the task's longest episode has {needed} tokens "
                         f"(with ppo.max_new_tokens={max_new_tokens}), got {policy.max_seq_len}")
    return max_new_tokens, policy.max_seq_len or needed


def check_length_penalty(actor: ActorConfig, runtime: TaskRuntime, max_new_tokens: int) -> None:
    """The DAPO length penalty counts an episode's generated tokens against
    ``actor.max_new_tokens``: it must be the trainer's budget, or no row is ever penalized
    (the default 1024 dwarfs these tasks)."""
    budget = max_new_tokens * runtime.task.max_turns
    if actor.overlong_reward_penalty and actor.max_new_tokens != budget:
        raise ValueError(f"actor.max_new_tokens: the length penalty compares generated tokens "
                         f"with it, and this run generates at most {budget} per episode "
                         f"(ppo.max_new_tokens {max_new_tokens} x {runtime.task.max_turns} turns); "
                         f"set it to {budget}, got {actor.max_new_tokens}")


def check_trainer_options(actor: ActorConfig, prm: PRMConfig) -> None:
    """Combinations the trainer cannot run, caught before training; errors name the key."""
    process = actor.advantage.process_adv_shaping
    if prm.enabled and not actor.advantage.is_replaced and (
            process is None or process.implementation == "auto"):
        # The call-time mode is used: check it against the actor now, not at step 1.
        check_process_mode("prm.advantage_shaping.mode", prm.advantage_shaping.mode, actor)
    if actor.use_decoupled_loss:
        raise ValueError("actor.use_decoupled_loss: the built-in trainer is synchronous (behaviour "
                         "and proximal policy are the same model), so the decoupled loss is not "
                         "supported; set it to false")


def validate_model_config(values: Mapping[str, Any]) -> None:
    """Check a ``PPOModule`` config (the ``model`` section) without building any network:
    the config dataclasses, the task, the process scorers and the advantage module with its
    stages. Raises ``ValueError`` naming the key (``actor.advantage.estimator: ...``)."""
    actor = _as(ActorConfig, values.get("actor"), "actor")
    policy = _as(PolicyConfig, values.get("policy"), "policy")
    ppo = _as(PPOConfig, values.get("ppo"), "ppo")
    task = _as(TaskConfig, values.get("task"), "task")
    prm = _as(PRMConfig, values.get("prm"), "prm")
    check_trainer_options(actor, prm)
    runtime = TaskRuntime(task)
    max_new_tokens, _ = sequence_budget(runtime, ppo, policy)
    check_length_penalty(actor, runtime, max_new_tokens)
    for i, spec in enumerate(prm.scorers):
        resolve_callable(spec.path, spec.kwargs, f"prm.scorers[{i}].path")
    path = values.get("advantage_module") or "lightning_adv.AdvantageModule"
    build_advantage_module(path, actor)
