"""``PPOModule``: on-policy PPO for a tiny causal transformer, in one LightningModule.

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
   histogram of advantages; the KL controller takes the step's KL.

Every random draw of a step comes from generators seeded by (seed, step, rank) (the
prompt order by (seed, epoch), the initial weights by the seed), so a
resumed run reproduces the next step exactly.
"""

from __future__ import annotations

import contextlib
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
from torch import Tensor, nn

from lightning_adv.validators import check_bool, check_choice, check_int, check_number, fail, is_int
from lightning_adv.config import (
    PRM_MODES, ActorConfig, convert_field, nested_config, PRMAdvantageShapingConfig, check_gvpo_kwargs, check_json_kwargs,
    check_process_mode, is_dotted_path)
from lightning_adv.distributed import report_failure
from lightning_adv.advantage_metrics import AdvantageMetrics
from lightning_adv.kl_control import KLControllerConfig
from lightning_adv.ppo_loss import KL_ESTIMATORS, LOSS_AGG_MODES, RATIO_LEVELS, PPOLoss
from lightning_adv.meta import BatchMeta
from lightning_adv.module import AdvantageModule
from lightning_adv.recipes import critic_free_reason
from lightning_adv.dotted_path import import_object, resolve_callable
from lightning_adv.trainer.dynamic_sampling import DynamicSamplingConfig, sample_with_signal
from lightning_adv.trainer.recipe_inputs import (
    baseline_rewards, check_greedy_baseline, greedy_rewards)
from lightning_adv.trainer.data import (
    PromptDataset, PromptLoader, PromptSampler, derive_seed, generator)
from lightning_adv.trainer.metrics import StepMetrics, rlhf_rewards
from lightning_adv.trainer.evaluation import (
    STAGES as EVAL_STAGES, EvalConfig, EvalMetrics, held_out_loader, prediction_records)
from lightning_adv.trainer.resume import reconcile_checkpoint
from lightning_adv.trainer.sample_log import SampleLogConfig, samples_markdown
from lightning_adv.trainer.policy import CausalTransformer
from lightning_adv.trainer.logprobs import logprobs_and_entropy, picked_logprobs_and_entropy
from lightning_adv.trainer.policy_config import PolicyConfig
from lightning_adv.trainer.sampling import build_batch, finite_or_raise, generate, score
from lightning_adv.trainer.scoring import scoring_passes
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
    top_k: int = 0
    """sample from the k most likely tokens only (0: all; a Hugging Face policy only)"""
    top_p: float = 1.0
    """sample from the smallest set of tokens whose probability reaches top_p (1.0: all; a
    Hugging Face policy only). Log-probs in the loss are those of the full distribution"""
    epochs: int = 2
    """PPO epochs over each rollout batch"""
    minibatches: int = 4
    """minibatches per PPO epoch, one optimizer step each"""
    micro_batch_size: Optional[int] = None
    """rows per forward and backward pass of the update: a minibatch runs as micro-batches
    whose gradients accumulate into its one optimizer step (the same step, to float
    rounding); null: the whole minibatch at once (verl's ppo_micro_batch_size_per_gpu, TRL's
    per_device_train_batch_size with gradient_accumulation_steps)"""
    forward_batch_size: Optional[int] = None
    """rows per forward pass of the scoring step (values, recomputed and reference
    log-probs, sum_pi_squared), each chunk cut to its longest row; null: the whole rollout
    batch in one pass. Lower it when a large vocabulary's [rows, T, V] logits do not fit
    (verl's log_prob_micro_batch_size_per_gpu, OpenRLHF's micro_rollout_batch_size)"""
    clip_eps: float = 0.2
    """clip range of the probability ratio: [1 - clip_eps, 1 + clip_eps]"""
    clip_eps_high: Optional[float] = None
    """upper clip range, 1 + clip_eps_high (DAPO's clip-higher; null: clip_eps)"""
    dual_clip: Optional[float] = None
    """dual-clip PPO: c > 1 bounds the loss of negative-advantage tokens by -A * c (null: off)"""
    loss_agg_mode: str = "token-mean"
    """how per-token losses become one number (verl's agg_loss): token-mean,
    seq-mean-token-sum, seq-mean-token-mean or seq-mean-token-sum-norm (Dr.GRPO)"""
    loss_scale_factor: Optional[float] = None
    """the constant divisor of seq-mean-token-sum-norm (null: the episode's token budget,
    max_new_tokens x the task's turns)"""
    ratio_level: str = "token"
    """importance ratio per token (PPO) or per sequence (GSPO)"""
    kl_loss_coef: float = 0.0
    """weight of a KL-to-reference term in the loss (GRPO's beta); the reward-side KL
    penalty is actor.kl_ctl. Either > 0 loads a frozen reference policy"""
    kl_loss_estimator: str = "k3"
    """estimator of the KL loss term: k1, k2, k3 (= low_var_kl) or abs"""
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
    kv_cache: bool = True
    """sample with incremental decoding (a KV cache; the critic's values come from the same
    pass); false: re-read every prefix at each new token (slower, same samples)"""
    bootstrap_truncated: bool = False
    """bootstrap rows cut by the token limit from the critic's value after their last token
    (AReaL's behaviour; no loss ever trains that value); false: the limit ends the episode,
    so the value after its last token is 0"""
    greedy_baseline: bool = False
    """also sample one greedy response per prompt; its task reward is the batch key
    reward_baselines (ReMax's baseline, recipe remax); it takes no part in the update"""
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    """DAPO dynamic sampling: {enabled, max_rounds}: keep only prompt groups whose rewards
    differ, sampling more prompts (up to max_rounds rounds) until the step is full"""

    def __post_init__(self) -> None:
        for name in ("prompts_per_step", "n_samples", "epochs", "minibatches"):
            check_int(f"ppo.{name}", getattr(self, name))
        if self.max_new_tokens is not None:
            check_int("ppo.max_new_tokens", self.max_new_tokens)
        check_int("ppo.top_k", self.top_k, minimum=0)
        check_number("ppo.top_p", self.top_p, positive=True, maximum=1.0)
        for name in ("temperature", "clip_eps", "lr"):
            check_number(f"ppo.{name}", getattr(self, name), positive=True)
        if self.clip_eps >= 1:
            # The ratio's lower bound 1 - clip_eps would be <= 0: nothing is clipped below.
            fail("ppo.clip_eps", "a number in (0, 1) (the ratio is clipped to "
                 "[1 - clip_eps, 1 + clip_eps])", self.clip_eps)
        if self.lr > 1:
            fail("ppo.lr", "a learning rate in (0, 1]", self.lr)
        for name in ("weight_decay", "value_coef", "entropy_coef", "kl_loss_coef"):
            check_number(f"ppo.{name}", getattr(self, name), minimum=0.0)
        check_choice("ppo.loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        check_choice("ppo.ratio_level", self.ratio_level, RATIO_LEVELS)
        check_choice("ppo.kl_loss_estimator", self.kl_loss_estimator, KL_ESTIMATORS)
        for name in ("clip_eps_high", "loss_scale_factor"):
            if getattr(self, name) is not None:
                check_number(f"ppo.{name}", getattr(self, name), positive=True)
        if self.dual_clip is not None:
            check_number("ppo.dual_clip", self.dual_clip, minimum=1.0)
            if self.dual_clip == 1.0:
                fail("ppo.dual_clip", "a number > 1 or null", self.dual_clip)
        check_bool("ppo.bootstrap_truncated", self.bootstrap_truncated)
        check_bool("ppo.greedy_baseline", self.greedy_baseline)
        convert_field(self, "dynamic_sampling", nested_config(
            DynamicSamplingConfig, "ppo.dynamic_sampling", self.dynamic_sampling))
        if not isinstance(self.dynamic_sampling, DynamicSamplingConfig):
            fail("ppo.dynamic_sampling", "{enabled: true|false, max_rounds: N}", self.dynamic_sampling)
        if self.dynamic_sampling.enabled and self.n_samples < 2:
            fail("ppo.dynamic_sampling.enabled", "false with ppo.n_samples < 2 (a group of one "
                 "response never has differing rewards)", True)
        check_bool("ppo.kv_cache", self.kv_cache)
        if self.forward_batch_size is not None and not is_int(self.forward_batch_size, 1):
            fail("ppo.forward_batch_size", "null (the whole rollout batch) or a positive "
                 "integer (rows per scoring forward pass)", self.forward_batch_size)
        if self.micro_batch_size is not None and not is_int(self.micro_batch_size, 1):
            fail("ppo.micro_batch_size", "null (the whole minibatch) or a positive integer "
                 "(rows per forward and backward pass of the update)", self.micro_batch_size)
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
        shaping = nested_config(PRMAdvantageShapingConfig, "prm.advantage_shaping",
                                self.advantage_shaping)
        convert_field(self, "advantage_shaping", shaping)
        scorers = [nested_config(ScorerSpec, f"prm.scorers[{i}]", s)
                   for i, s in enumerate(self.scorers)]
        convert_field(self, "scorers", scorers)
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
    value = nested_config(cls, key, value)
    if isinstance(value, cls):
        return value
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
        kl_controller: drives the reward-side KL coefficient, starting at ``actor.kl_ctl``:
            ``fixed`` or ``adaptive`` (Ziegler et al. 2019, with ``target`` and ``horizon``).
        evaluation: held-out prompts of ``validate``, ``test``, ``predict`` and of validation
            during ``fit`` (greedy reward, pass@k).
        sample_log: a few responses logged as text every N training steps.
    """

    def __init__(self, actor: ActorConfig = ActorConfig(), policy: PolicyConfig = PolicyConfig(),
                 ppo: PPOConfig = PPOConfig(), task: TaskConfig = TaskConfig(),
                 prm: PRMConfig = PRMConfig(),
                 advantage_module: str = "lightning_adv.AdvantageModule",
                 seed: Optional[int] = None,
                 kl_controller: KLControllerConfig = KLControllerConfig(),
                 evaluation: EvalConfig = EvalConfig(),
                 sample_log: SampleLogConfig = SampleLogConfig()):
        super().__init__()
        self.automatic_optimization = False
        self.actor_config = _as(ActorConfig, actor, "actor")
        self.policy_config = _as(PolicyConfig, policy, "policy")
        self.ppo_config = _as(PPOConfig, ppo, "ppo")
        self.task_config = _as(TaskConfig, task, "task")
        self.prm_config = _as(PRMConfig, prm, "prm")
        self.kl_controller_config = _as(KLControllerConfig, kl_controller, "kl_controller")
        self.eval_config = _as(EvalConfig, evaluation, "evaluation")
        self.sample_log_config = _as(SampleLogConfig, sample_log, "sample_log")
        check_trainer_options(self.actor_config, self.prm_config, self.kl_controller_config)
        warn_unused_critic(self.actor_config, self.policy_config)
        self.save_hyperparameters(module_hparams(
            self.actor_config, self.policy_config, self.ppo_config, self.task_config,
            self.prm_config, advantage_module, seed, self.kl_controller_config,
            self.eval_config, self.sample_log_config))

        hf = check_hf_options(self.policy_config, self.ppo_config, self.task_config)
        self.runtime, self.max_new_tokens, max_len = task_runtime(
            self.task_config, self.ppo_config, self.policy_config, hf,
            self.actor_config.unscorable_rewards)
        check_length_penalty(self.actor_config, self.runtime, self.max_new_tokens)
        check_rollout_shape(self.actor_config, self.ppo_config, self.task_config, self.runtime)
        self._seed = seed
        self.hf_tokenizer = hf.tokenizer.tokenizer if hf is not None else None
        """the Hugging Face policy's tokenizer (saved beside it); None for the built-in policy"""
        self.advantage = build_advantage_module(advantage_module, self.actor_config)
        self.recipe_inputs = self.advantage.required_batch_keys
        """optional batch keys the advantage stages read (sum_pi_squared, reward_baselines, ...)"""
        check_greedy_baseline(self.recipe_inputs, self.ppo_config.greedy_baseline)
        self.policy, self.ref_policy = self._build_policies(max_len)
        self.critic = self.policy_config.value_head
        self.scorers = [(f"prm.scorers[{i}] {s.path!r}",
                         resolve_callable(s.path, s.kwargs, f"prm.scorers[{i}].path"),
                         float(s.weight), dict(s.kwargs))
                        for i, s in enumerate(self.prm_config.scorers)] if self.prm_config.enabled else []
        self.prm_shaping = self.prm_config.advantage_shaping if self.prm_config.enabled else None
        self.kl_controller = self.kl_controller_config.build(self.actor_config.kl_ctl)
        self.loss_fn = ppo_loss(self.ppo_config, self.max_new_tokens * self.runtime.task.max_turns)
        self.metrics = StepMetrics(critic=self.critic)
        self.adv_metrics = AdvantageMetrics(prefix="train/", dist_sync_on_step=False)
        self.eval_metrics = nn.ModuleDict({stage: EvalMetrics(self.eval_config.pass_k)
                                           for stage in EVAL_STAGES})
        self.rollout_step = 0
        """training steps (rollouts) done so far; seeds the next step's generators"""
        self.reward_history: list[float] = []
        """mean task reward of each training step of this process (for the run summary)"""
        self._loader: Optional[PromptLoader] = None

    def _build_policies(self, max_len: int) -> tuple[torch.nn.Module, Any]:
        """The policy and, when a KL term needs it, the frozen reference (under LoRA the
        policy with its adapters disabled). The initial weights come from the run's seed
        too, not from whatever the global RNG holds: the same seed, the same policy."""
        need_reference = (self.actor_config.kl_ctl > 0 or self.ppo_config.kl_loss_coef > 0
                          or "ref_logp" in self.recipe_inputs)
        if self.hf_tokenizer is not None:
            from lightning_adv.trainer.hf_policy import build_hf_policy

            policy = build_hf_policy(self.policy_config, seed=derive_seed(self.seed, "init"))
            return policy, policy.reference() if need_reference else None
        vocab = self.runtime.vocab
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.seed, "init"))
            policy = CausalTransformer(self.policy_config, len(vocab), max_len,
                                       banned_tokens=(vocab.pad_id, vocab.bos_id))
        if not need_reference:
            return policy, None
        reference = copy.deepcopy(policy)
        reference.value_head = None
        reference.requires_grad_(False)  # no dropout or batch norm: mode is moot
        return policy, reference

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
        # config's values win (README "Resuming").
        for group in self.optimizers().optimizer.param_groups:
            group["lr"] = self.ppo_config.lr
            group["weight_decay"] = self.ppo_config.weight_decay

    def on_fit_start(self) -> None:
        if self.hf_tokenizer is not None:
            from lightning_adv.trainer.hf_policy import check_device_dtype

            check_device_dtype(self.policy_config.dtype, self.device)
            if self._fsdp() and self.policy_config.lora is not None:
                raise ValueError("policy.lora: LoRA under the FSDP strategy is not supported "
                                 "(saving would need the sharded adapters merged); use DDP")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["lightning_adv"] = {"rollout_step": self.rollout_step, "seed": self.seed}
        self.save_hf_model()

    def on_train_end(self) -> None:
        self.save_hf_model()

    @property
    def hf_model_dir(self) -> Optional[str]:
        """Where the Hugging Face policy is saved: ``<run directory>/hf_model`` (None for the
        built-in policy)."""
        if self.hf_tokenizer is None or self._trainer is None:
            return None
        return os.path.join(self.trainer.log_dir or self.trainer.default_root_dir, "hf_model")

    def _fsdp(self) -> bool:
        from lightning.pytorch.strategies import FSDPStrategy

        return self._trainer is not None and isinstance(self.trainer.strategy, FSDPStrategy)

    def save_hf_model(self) -> None:
        """Write the policy with ``save_pretrained`` (rank 0), with each checkpoint and at the
        end of fit: ``AutoModelForCausalLM.from_pretrained(<run directory>/hf_model)``.
        Under FSDP every rank takes part in gathering the full state dict first."""
        directory = self.hf_model_dir
        if directory is None:
            return
        state = None
        if self._fsdp():  # collective: the full, unsharded weights, on rank 0 only
            full = self.trainer.strategy.lightning_module_state_dict()
            state = {k[len("policy."):]: v for k, v in full.items() if k.startswith("policy.")}
        if self.trainer.is_global_zero:
            self.policy.save_pretrained(directory, self.hf_tokenizer, state_dict=state)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        reconcile_checkpoint(checkpoint, self.state_dict(), dict(self.hparams))
        state = checkpoint.get("lightning_adv", {})
        self.rollout_step = int(state.get("rollout_step", 0))
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
        greedy = self._generate(indices, 1, gen, greedy=True)
        sampled = self._generate(indices, self.eval_config.n_samples, gen)
        score(greedy, self.runtime)
        score(sampled, self.runtime)
        return greedy, sampled

    def _generate(self, indices: list[int], n: int, gen: torch.Generator,
                  greedy: bool = False) -> list[list[Any]]:
        """``n`` episodes per prompt with either policy, at the rollout's sampling settings
        (``greedy``: the most likely token)."""
        cfg = self.ppo_config
        if self.hf_tokenizer is None:
            return generate(self.policy, self.runtime, indices, n, self.max_new_tokens,
                            cfg.temperature, gen, kv_cache=cfg.kv_cache, greedy=greedy)
        from lightning_adv.trainer.hf_sampling import SamplingParams, hf_generate

        # top-k 1 leaves the most likely token alone: the draw is the argmax
        params = (SamplingParams(top_k=1) if greedy else
                  SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p))
        return hf_generate(self.policy, self.runtime, indices, n, self.max_new_tokens, params,
                           gen, kv_cache=cfg.kv_cache)

    def _evaluation_step(self, batch: Tensor, batch_idx: int, stage: str) -> None:
        greedy, sampled = self.evaluate(batch.tolist(), stage, batch_idx)
        metrics = self.eval_metrics[stage]
        metrics.update(greedy, sampled, self.eval_config.success_threshold)
        for name, metric in metrics.items():
            self.log(f"{stage}/{name}", metric, on_step=False, on_epoch=True, batch_size=len(greedy))
        if batch_idx == 0 and self.sample_log_config.every_n_steps:
            self._log_text(f"{stage}/samples", samples_markdown(greedy, self.sample_log_config.count))

    def _log_text(self, tag: str, text: str) -> None:
        experiment = getattr(self.logger, "experiment", None)
        if self.global_rank == 0 and hasattr(experiment, "add_text"):
            experiment.add_text(tag, text, self.rollout_step)

    # ------------------------------------------------------------------ the training step

    def training_step(self, batch: Tensor, batch_idx: int) -> None:
        step, rank = self.rollout_step, self.global_rank
        try:
            groups, sampled = self.sample_groups(batch.tolist(), step, rank)
            baselines = None
            if self.ppo_config.greedy_baseline:
                baselines = self.greedy_baselines([g[0].index for g in groups])
                self.log("train/greedy_reward", sum(baselines) / len(baselines), on_step=True,
                         on_epoch=False, batch_size=len(baselines), sync_dist=True)
            rollout, meta = self.make_batch(groups, baselines)
        except Exception:
            # A task function failing on this rank only: the other ranks are about to wait
            # in the advantage module's collectives; let them fail too.
            report_failure(self.device)
            raise
        self._apply_kl_coef()
        out = self.advantage(rollout, meta, prm=self.prm_shaping)
        self.update(rollout, out, generator(self.seed, "minibatches", step, rank))
        self.log_step(rollout, out, meta, groups, sampled)
        self._update_kl_controller(out)
        self.rollout_step += 1
        if self._loader is not None:
            self._loader.step_done(self.current_epoch)

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
        prompts = generator(self.seed, "dynamic_sampling", step, rank)
        pool = self.runtime.num_prompts

        def draw(n: int) -> list[int]:
            return torch.randint(pool, (n,), generator=prompts).tolist()

        result = sample_with_signal(indices, lambda idx: self.rollout(idx, gen), draw,
                                    dynamic.max_rounds)
        if result.short:
            warnings.warn(f"ppo.dynamic_sampling: after {result.rounds} rounds (max_rounds) only "
                          f"{len(result.groups) - len(result.topped_up)} of {len(indices)} prompt "
                          f"groups have differing rewards; training step {step} on them and "
                          f"{len(result.topped_up)} groups of equal rewards", UserWarning,
                          stacklevel=2)
        self.log_dict({"train/dynamic_filtered_fraction": result.filtered_fraction,
                       "train/dynamic_rounds": float(result.rounds)}, on_step=True,
                      on_epoch=False, batch_size=len(indices), sync_dist=True)
        return result.groups, result.first_round

    @torch.no_grad()
    def rollout(self, indices: list[int], gen: torch.Generator) -> list[list[Any]]:
        """Sample and score ``n_samples`` episodes for each prompt index."""
        self.policy.eval()
        cfg = self.ppo_config
        if self.hf_tokenizer is not None:
            from lightning_adv.trainer.hf_sampling import SamplingParams, hf_generate

            groups = hf_generate(self.policy, self.runtime, indices, cfg.n_samples,
                                 self.max_new_tokens,
                                 SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p), gen,
                                 kv_cache=cfg.kv_cache)
        else:
            # The value after an episode's last token is read only when it is used
            # (make_batch sets it to 0 unless ppo.bootstrap_truncated)
            groups = generate(self.policy, self.runtime, indices, cfg.n_samples,
                              self.max_new_tokens, cfg.temperature, gen, kv_cache=cfg.kv_cache,
                              last_values=cfg.bootstrap_truncated)
        self.policy.train()
        score(groups, self.runtime, self.scorers)
        return groups

    @torch.no_grad()
    def greedy_baselines(self, indices: list[int]) -> list[float]:
        """The task reward of one greedy response per prompt (``ppo.greedy_baseline``)."""
        if self.hf_tokenizer is None:
            return greedy_rewards(self.policy, self.runtime, indices, self.max_new_tokens,
                                  self.ppo_config.kv_cache)
        from lightning_adv.trainer.hf_sampling import SamplingParams, hf_generate

        self.policy.eval()
        # top-k 1 leaves the most likely token alone: the draw is the argmax
        groups = hf_generate(self.policy, self.runtime, indices, 1, self.max_new_tokens,
                             SamplingParams(top_k=1), torch.Generator(),
                             kv_cache=self.ppo_config.kv_cache)
        self.policy.train()
        score(groups, self.runtime)
        return baseline_rewards(groups)

    @torch.no_grad()
    def make_batch(self, groups: list[list[Any]],
                   reward_baselines: Optional[list[float]] = None) -> tuple[dict[str, Any], BatchMeta]:
        """The SPEC §1 batch: episodes, then values / ref_logp / prox_logp from model passes
        (over ``ppo.forward_batch_size`` rows at a time), and the optional keys the
        advantage stages read (``recipe_inputs``)."""
        batch, meta = build_batch(groups, multi_turn=self.runtime.task.max_turns > 1,
                                  process_rewards=bool(self.scorers))
        batch = {k: v.to(self.device) if isinstance(v, Tensor) else v for k, v in batch.items()}
        ids, attention = batch["input_ids"], batch["attention_mask"].float()
        next_real = torch.nn.functional.pad(attention[:, 1:], (0, 1))  # token t+1 exists
        sampled_values = batch.pop("values", None)
        recompute = self.actor_config.recompute_logprob
        # The sampler's cached pass already read every token: its values serve unless the
        # log-probs are recomputed anyway.
        fresh_values = self.critic and (recompute or sampled_values is None)
        # A prompt's samples share its tokens (the reference reads them once)
        generated = batch["loss_mask"] > 0
        sizes = set(meta.traj_group_sizes)
        prompts = ((generated.int().argmax(1), sizes.pop())
                   if len(sizes) == 1 and bool(generated.any(1).all()) else None)
        passes = scoring_passes(self.policy, self.ref_policy, ids, attention.sum(1).long(),
                                self.ppo_config.temperature, values=fresh_values,
                                logprobs=recompute,
                                pi_squared="sum_pi_squared" in self.recipe_inputs,
                                rows=self.ppo_config.forward_batch_size, prompts=prompts)
        if self.critic:
            values = passes["values"] if fresh_values else sampled_values
            values = finite_or_raise(values.float(), "values") * attention
            if not self.ppo_config.bootstrap_truncated:
                # The core bootstraps truncated rows with the value after their last
                # token; here the token limit is terminal, so that state's value is 0.
                last = attention.sum(1).long() - 1
                values[torch.arange(len(last), device=values.device), last] = 0.0
            batch["values"] = values
        for key in ("prox_logp", "ref_logp", "sum_pi_squared"):
            if key in passes:
                batch[key] = passes[key] * next_real
        if reward_baselines is not None:
            sizes = torch.tensor(meta.traj_group_sizes, device=self.device)
            batch["reward_baselines"] = torch.repeat_interleave(
                torch.tensor(reward_baselines, dtype=torch.float32, device=self.device), sizes)
        return batch, meta

    def update(self, batch: dict[str, Any], out: dict[str, Any], gen: torch.Generator) -> None:
        """PPO epochs x minibatches of optimizer steps on :class:`~lightning_adv.PPOLoss`
        (manual optimization); each minibatch runs as micro-batches of at most
        ``ppo.micro_batch_size`` rows whose gradients accumulate, each cut to its longest
        row and normalized by the minibatch's token counts."""
        cfg = self.ppo_config
        opt = self.optimizers()
        rows = batch["input_ids"].shape[0]
        lengths = batch["attention_mask"].sum(1)
        for _ in range(cfg.epochs):
            order = torch.randperm(rows, generator=gen).to(self.device)
            for chunk in order.tensor_split(cfg.minibatches):
                micro = [chunk] if cfg.micro_batch_size is None else list(
                    chunk.split(cfg.micro_batch_size))
                counts = None
                if len(micro) > 1:  # one collective per minibatch, before any backward
                    counts = self.loss_fn.counts(out["loss_mask"][chunk])
                opt.zero_grad()
                for i, part in enumerate(micro):
                    # DDP averages gradients at the last micro-batch's backward only
                    with self._accumulating(last=i == len(micro) - 1):
                        result = self._micro_batch_loss(batch, out, part, lengths, counts)
                        self.manual_backward(result["loss"])
                    self.adv_metrics.update(loss=result)
                if cfg.max_grad_norm is not None:
                    self.clip_gradients(opt, gradient_clip_val=cfg.max_grad_norm,
                                        gradient_clip_algorithm="norm")
                opt.step()

    def _micro_batch_loss(self, batch: dict[str, Any], out: dict[str, Any], rows: Tensor,
                          lengths: Tensor, counts: Any) -> dict[str, Tensor]:
        """:class:`~lightning_adv.PPOLoss` on ``rows``, cut to their longest row."""
        cfg = self.ppo_config
        width = int(lengths[rows].max())
        ids = batch["input_ids"][rows, :width]

        def cut(x: Optional[Tensor]) -> Optional[Tensor]:
            return None if x is None else x[rows, :width]

        mask = cut(out["loss_mask"])
        # With entropy_coef 0 the entropy is only reported: no graph for it.
        entropy_grad = cfg.entropy_coef > 0
        if isinstance(self.policy, CausalTransformer):
            logprobs, values, ent = loss_positions_pass(self.policy, ids, mask > 0,
                                                        cfg.temperature, entropy_grad)
        else:
            logits, values = self.policy(ids)
            logprobs, ent = logprobs_and_entropy(logits, ids, cfg.temperature,
                                                 entropy_grad=entropy_grad)
        critic = {}
        if self.critic:
            critic = dict(values=values, old_values=cut(batch["values"]),
                          returns=cut(out["returns"]))
        ref_logp = out.get("ref_logp") if cfg.kl_loss_coef > 0 else None
        return self.loss_fn(logprobs, cut(out["logprobs"]), cut(out["advantages"]), mask,
                            ref_logprobs=cut(ref_logp), entropy=ent, counts=counts, **critic)

    def _accumulating(self, last: bool) -> Any:
        """No gradient all-reduce before a minibatch's last micro-batch (DDP's no_sync);
        a no-op outside DDP."""
        strategy = self._trainer.strategy if self._trainer is not None else None
        if last or not hasattr(strategy, "block_backward_sync"):
            return contextlib.nullcontext()
        return strategy.block_backward_sync()

    @torch.no_grad()
    def log_step(self, batch: dict[str, Any], out: dict[str, Any], meta: BatchMeta,
                 groups: list[list[Any]], sampled: Optional[list[list[Any]]] = None) -> None:
        """``sampled``: the groups whose rewards ``train/task_reward`` reports (default
        ``groups``; under dynamic sampling the first round's, unfiltered)."""
        m = out["loss_mask"]
        metrics = self.metrics
        episodes = [ep for group in groups for ep in group]
        task_rewards = torch.tensor([ep.reward for ep in episodes], device=m.device)
        reported = [ep.reward for group in (sampled or groups) for ep in group]
        # Unscorable episodes (NaN, actor.unscorable_rewards: exclude) have no reward to
        # average: the reward means are over the scored ones (the lengths count them all).
        metrics.update_scored("task_reward", torch.tensor(reported, device=m.device))
        metrics.update_scored("rlhf_reward", rlhf_rewards(task_rewards, out))
        metrics.update("response_length", batch["loss_mask"].sum(1).float())
        metrics.update("truncated", batch["is_truncated"].float())
        metrics.update("turns", torch.tensor([float(len(ep.turns)) for ep in episodes]))
        if self.critic:
            # An unscorable row's returns are its own values (it has no target): counted,
            # its tokens would be perfectly predicted ones and lift explained variance.
            scored = m if "unscorable" not in out else m * ~out["unscorable"][:, None]
            metrics.update_values(batch["values"], out["returns"], scored)
        self.adv_metrics.update(out, meta)
        values = {**metrics.compute(), **self.adv_metrics.compute()}
        self.adv_metrics.reset()
        values["train/kl_coef"] = torch.tensor(self.kl_controller.value)
        n = len(episodes)
        reward = values.pop("train/task_reward")
        self.reward_history.append(float(reward))
        self.log("train/task_reward", reward, prog_bar=True, on_step=True, on_epoch=False,
                 batch_size=n)
        self.log_dict(values, on_step=True, on_epoch=False, batch_size=n)
        self._log_histogram("train/advantages", out["advantages"][m > 0])
        if self.sample_log_config.due(self.rollout_step):
            self._log_text("train/samples", samples_markdown(groups, self.sample_log_config.count))

    def _apply_kl_coef(self) -> None:
        """The advantage module's reward-side KL coefficient follows the controller."""
        coef = self.kl_controller.value
        if coef != self.advantage.config.kl_ctl:
            self.advantage.config = dataclasses.replace(self.advantage.config, kl_ctl=coef)

    @torch.no_grad()
    def _update_kl_controller(self, out: dict[str, Any]) -> None:
        """Feed the controller the KL between the rollout and the reference policy: the mean
        over episodes of each episode's summed k1 estimate (TRL's and Ziegler et al.'s
        measure), global under DDP so every rank's controller moves alike."""
        if self.kl_controller_config.type == "fixed" or out.get("ref_logp") is None:
            return
        mask = out["loss_mask"]
        per_row = ((out["logprobs"] - out["ref_logp"]) * mask).sum(1)
        totals = torch.stack([per_row.sum(), torch.tensor(float(len(per_row)), device=per_row.device)])
        totals = totals.double()
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(totals)
        self.kl_controller.update(float(totals[0] / totals[1]), n_steps=int(totals[1]))

    def _log_histogram(self, tag: str, values: Tensor) -> None:
        logger = self.logger
        every = max(1, int(getattr(self.trainer, "log_every_n_steps", 1) or 1))
        if logger is None or (self.rollout_step + 1) % every:
            return
        experiment = getattr(logger, "experiment", None)
        if self.global_rank == 0 and hasattr(experiment, "add_histogram") and values.numel():
            experiment.add_histogram(tag, values.float().cpu(), self.rollout_step)


def loss_positions_pass(policy: CausalTransformer, ids: Tensor, active: Tensor, temperature: float,
                        entropy_grad: bool) -> tuple[Tensor, Optional[Tensor], Tensor]:
    """The policy's next-token log-probs, values and entropies over the ``[B, T]`` rows
    ``ids``, computed at the loss mask's positions ``active`` only
    (:meth:`~lightning_adv.trainer.policy.CausalTransformer.forward_selected`) and 0
    elsewhere: :class:`~lightning_adv.PPOLoss` never reads the other positions, so the loss
    and its gradient are those of a full forward pass, to float rounding."""
    logits, values = policy.forward_selected(ids, active)
    targets = torch.nn.functional.pad(ids[:, 1:], (0, 1))[active]  # token t+1 at position t
    logprobs, ent = picked_logprobs_and_entropy(logits, targets, temperature, entropy_grad)

    def spread(x: Tensor) -> Tensor:
        return x.new_zeros(active.shape).masked_scatter(active, x)

    return spread(logprobs), None if values is None else spread(values), spread(ent)


def check_hf_options(policy: PolicyConfig, ppo: PPOConfig, task: TaskConfig) -> Any:
    """A pretrained policy's setup (files, config, tokenizer; no weights loaded), or None for
    the built-in policy, whose sampler has no top-k / top-p and no stop strings."""
    if policy.pretrained is None:
        for name, off in (("top_k", 0), ("top_p", 1.0)):
            if getattr(ppo, name) != off:
                raise ValueError(f"ppo.{name}: supported with a Hugging Face policy "
                                 f"(policy.pretrained) only; the built-in policy samples from "
                                 f"the full distribution")
        if task.stop_strings:
            raise ValueError("task.stop_strings: supported with a Hugging Face policy "
                             "(policy.pretrained) only; the built-in policy's turns end at "
                             "<eos> or the token limit")
        return None
    from lightning_adv.trainer.hf_policy import check_hf_policy

    return check_hf_policy(policy, task.chat_template)


def task_runtime(task: TaskConfig, ppo: PPOConfig, policy: PolicyConfig, hf: Any,
                 unscorable_rewards: str = "error") -> tuple[TaskRuntime, int, int]:
    """The task with its tokenizer (the character vocabulary, or the HF tokenizer of
    ``hf``), the tokens per policy turn and the built-in policy's sequence length; under
    ``unscorable_rewards: exclude`` its reward may be None or NaN (unscorable). With a
    HF policy every prompt must leave room in the context window for the episode: every
    turn's limit and the replies between (counted in the task's symbols; a chat
    template's framing is checked while sampling)."""
    runtime = TaskRuntime(task, tokenizer=hf.tokenizer if hf is not None else None,
                          unscorable_rewards=unscorable_rewards)
    max_new_tokens, max_len = sequence_budget(runtime, ppo, policy)
    if hf is not None:
        t = runtime.task
        runtime.context_window = hf.context_window
        runtime.episode_budget = t.max_turns * max_new_tokens + (t.max_turns - 1) * t.max_reply_len
    return runtime, max_new_tokens, max_len


def warn_unused_critic(actor: ActorConfig, policy: PolicyConfig) -> None:
    """A critic-free recipe with a value head: GAE would subtract the critic's values on top
    of the recipe's own baseline (or train a critic nobody reads)."""
    reason = critic_free_reason(actor)
    if policy.value_head and reason is not None:
        warnings.warn(f"policy.value_head: true, but {reason}; the critic's values are subtracted "
                      f"as a second baseline or trained for nothing. Set model.policy.value_head: "
                      f"false for a critic-free recipe", UserWarning, stacklevel=3)


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


def ppo_loss(ppo: PPOConfig, episode_budget: int) -> PPOLoss:
    """The trainer's loss; Dr.GRPO's constant defaults to the episode's token budget."""
    scale = ppo.loss_scale_factor
    if scale is None and ppo.loss_agg_mode == "seq-mean-token-sum-norm":
        scale = float(episode_budget)
    return PPOLoss(clip_eps=ppo.clip_eps, clip_eps_high=ppo.clip_eps_high, dual_clip=ppo.dual_clip,
                   loss_agg_mode=ppo.loss_agg_mode, kl_coef=ppo.kl_loss_coef,
                   kl_estimator=ppo.kl_loss_estimator, entropy_coef=ppo.entropy_coef,
                   value_coef=ppo.value_coef, value_clip_eps=ppo.value_clip_eps,
                   ratio_level=ppo.ratio_level, loss_scale_factor=scale)


def module_hparams(actor: ActorConfig, policy: PolicyConfig, ppo: PPOConfig, task: TaskConfig,
                   prm: PRMConfig, advantage_module: str, seed: Optional[int],
                   kl_controller: KLControllerConfig, evaluation: EvalConfig,
                   sample_log: SampleLogConfig) -> dict[str, Any]:
    """The module's hyper-parameters as plain YAML types (what checkpoints store)."""
    return {"actor": dataclasses.asdict(actor), "policy": dataclasses.asdict(policy),
            "ppo": dataclasses.asdict(ppo), "task": dataclasses.asdict(task),
            "prm": dataclasses.asdict(prm), "advantage_module": advantage_module, "seed": seed,
            "kl_controller": dataclasses.asdict(kl_controller),
            "evaluation": dataclasses.asdict(evaluation), "sample_log": dataclasses.asdict(sample_log)}


def check_trainer_options(actor: ActorConfig, prm: PRMConfig,
                          kl_controller: KLControllerConfig = KLControllerConfig()) -> None:
    """Combinations the trainer cannot run, caught before training; errors name the key."""
    if prm.scorers and not prm.enabled:
        warnings.warn("prm.scorers: process scorers are configured but prm.enabled is false, so "
                      "they are not run; set prm.enabled: true to use them", stacklevel=3)
    if kl_controller.type == "adaptive" and actor.kl_ctl == 0:
        raise ValueError("kl_controller.type: the adaptive controller scales actor.kl_ctl, which "
                         "is 0 (it would stay 0); set actor.kl_ctl > 0 or use type 'fixed'")
    process = actor.advantage.process_adv_shaping
    if prm.enabled and not actor.advantage.is_replaced and (
            process is None or process.implementation == "auto"):
        # The call-time mode is used: check it against the actor now, not at step 1.
        check_process_mode("prm.advantage_shaping.mode", prm.advantage_shaping.mode, actor)
    if actor.use_decoupled_loss:
        raise ValueError("actor.use_decoupled_loss: the built-in trainer is synchronous (behaviour "
                         "and proximal policy are the same model), so the decoupled loss is not "
                         "supported; set it to false")


#: built-in outcome stages whose baseline is the prompt group's (zero for one-member groups)
GROUP_BASELINE_STAGES = ("opo_baseline", "gpg")


def group_settings(actor: ActorConfig) -> list[str]:
    """The actor's settings that compare the responses of one prompt group."""
    found = [f"actor.{name}.{level}" for name in ("reward_norm", "adv_norm")
             for level in ("mean_level", "std_level")
             if getattr(actor, name) is not None and getattr(getattr(actor, name), level) == "group"]
    outcome = actor.advantage.outcome_reward_shaping
    if outcome is not None and outcome.implementation in GROUP_BASELINE_STAGES:
        found.append(f"actor.advantage.outcome_reward_shaping ({outcome.implementation!r})")
    return found


def check_rollout_shape(actor: ActorConfig, ppo: PPOConfig, task: TaskConfig,
                        runtime: TaskRuntime, world_size: int = 1) -> None:
    """What one training step's rollout must hold for the config to make sense."""
    grouped = group_settings(actor)
    if grouped and ppo.n_samples < 2:
        raise ValueError(f"ppo.n_samples: each prompt needs at least 2 samples, because "
                         f"{', '.join(grouped)} work within each prompt's group of responses "
                         f"(with 1 sample every advantage is 0), got {ppo.n_samples}")
    if runtime.num_prompts < ppo.prompts_per_step:
        raise ValueError(f"task.num_prompts: the pool ({runtime.num_prompts}) is smaller than one "
                         f"step's prompts (ppo.prompts_per_step={ppo.prompts_per_step})")
    rows = ppo.prompts_per_step // max(world_size, 1) * ppo.n_samples
    if ppo.minibatches > rows:
        raise ValueError(f"ppo.minibatches: each minibatch needs at least one row, and a step has "
                         f"{rows} rows per rank (ppo.prompts_per_step {ppo.prompts_per_step} / "
                         f"{world_size} rank(s) x ppo.n_samples {ppo.n_samples}), got "
                         f"{ppo.minibatches}")
    if actor.estimator_unit == "turn" and runtime.task.max_turns < 2:
        spec = actor.advantage.estimator
        key = ("actor.advantage.estimator" if spec is not None and spec.implementation == "turn_gae"
               else "actor.gae_timestep_unit")
        raise ValueError(f"{key}: turn-level GAE needs a multi-turn task (the batch's turn_ids), "
                         f"and task {task.name!r} has one turn per episode; use estimator "
                         f"token_gae or a multi-turn task (guess)")


def world_size_of(trainer: Optional[Mapping[str, Any]]) -> int:
    """Ranks the trainer config asks for, where knowable without starting it (else 1)."""
    if not trainer:
        return 1
    devices, nodes = trainer.get("devices"), trainer.get("num_nodes") or 1
    if isinstance(devices, str) and devices.isdigit():  # the CLI parses "2" as a string
        devices = int(devices)
    if isinstance(devices, int) and devices > 0:
        return devices * nodes
    if isinstance(devices, (list, tuple)):
        return len(devices) * nodes
    return nodes


def validate_model_config(values: Mapping[str, Any],
                          trainer: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """Check a ``PPOModule`` config (the ``model`` section) without building any network:
    the config dataclasses, the task, the process scorers, the shape of a step's rollout
    (against ``trainer``'s devices, when given) and the advantage module with its stages.
    Raises ``ValueError`` naming the key (``actor.advantage.estimator: ...``); returns the
    module's hyper-parameters as its checkpoints store them."""
    actor = _as(ActorConfig, values.get("actor"), "actor")
    policy = _as(PolicyConfig, values.get("policy"), "policy")
    ppo = _as(PPOConfig, values.get("ppo"), "ppo")
    task = _as(TaskConfig, values.get("task"), "task")
    prm = _as(PRMConfig, values.get("prm"), "prm")
    kl_controller = _as(KLControllerConfig, values.get("kl_controller"), "kl_controller")
    evaluation = _as(EvalConfig, values.get("evaluation"), "evaluation")
    sample_log = _as(SampleLogConfig, values.get("sample_log"), "sample_log")
    check_trainer_options(actor, prm, kl_controller)
    hf = check_hf_options(policy, ppo, task)
    if hf is not None and policy.dtype == "float16" and not torch.cuda.is_available():
        from lightning_adv.trainer.hf_policy import check_device_dtype

        check_device_dtype(policy.dtype, "cpu")
    runtime, max_new_tokens, _ = task_runtime(task, ppo, policy, hf, actor.unscorable_rewards)
    # A dataset's every line (a missing prompt, one too long for the model) fails here,
    # before training; drawn tasks check the prompts of the first steps.
    runtime.check_prompts(None if task.dataset is not None else ppo.prompts_per_step)
    check_length_penalty(actor, runtime, max_new_tokens)
    check_rollout_shape(actor, ppo, task, runtime, world_size_of(trainer))
    for i, spec in enumerate(prm.scorers):
        resolve_callable(spec.path, spec.kwargs, f"prm.scorers[{i}].path")
    path = values.get("advantage_module") or "lightning_adv.AdvantageModule"
    module = build_advantage_module(path, actor)
    check_greedy_baseline(module.required_batch_keys, ppo.greedy_baseline)
    return module_hparams(actor, policy, ppo, task, prm, path, values.get("seed"), kl_controller,
                          evaluation, sample_log)
