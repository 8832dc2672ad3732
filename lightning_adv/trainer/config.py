"""The trainer's own config sections (``model.ppo`` with ``ppo.dynamic_sampling``,
``model.prm``, ``model.evaluation``, ``model.sample_log``) and the module's
hyper-parameters as checkpoints store them.

Every section is a frozen dataclass that checks itself; :func:`coerce_config` builds one
from a mapping (checkpoints and the CLI's pre-flight hold mappings), naming the key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from lightning_adv._checks import (
    check_bool, check_choice, check_gvpo_kwargs, check_int, check_number, fail, is_int)
from lightning_adv.config import (
    PRM_MODES, PRMAdvantageShapingConfig, check_json_kwargs, convert_field, nested_config)
from lightning_adv.dotted_path import is_dotted_path
from lightning_adv.losses.aggregation import LOSS_AGG_MODES
from lightning_adv.losses.ppo_loss import RATIO_LEVELS
from lightning_adv.losses.rollout_correction import RolloutCorrectionConfig
from lightning_adv.ops.kl import LOSS_KL_ESTIMATORS
from lightning_adv.trainer.rollout_config import (  # noqa: F401 -- re-exported: ppo's sections
    VINE_BOUNDARIES, DynamicSamplingConfig, TreeConfig, VineConfig)

#: the dtypes a sampler copy (``ppo.rollout_dtype``) may be cast to
ROLLOUT_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation: ``validate``, ``test``, ``predict`` and validation during ``fit``."""

    num_prompts: int = 64
    """held-out prompts in each of the validation and the test set (0: no evaluation, and
    fit runs no validation)"""
    n_samples: int = 4
    """sampled responses per prompt (at ppo.temperature) for reward_mean and pass@k"""
    pass_k: list[int] = field(default_factory=lambda: [1, 4])
    """the k of each logged pass@k (each at most n_samples)"""
    success_threshold: float = 1.0
    """a response whose task reward is at least this solves its prompt"""
    prompts_per_batch: int = 32
    """held-out prompts per evaluation batch"""
    predictions: Optional[str] = None
    """file predict writes its JSON lines to (null: predictions.jsonl in the run directory);
    an existing file is never overwritten (a free name is used)"""

    def __post_init__(self) -> None:
        check_int("evaluation.num_prompts", self.num_prompts, minimum=0)
        check_int("evaluation.n_samples", self.n_samples)
        check_int("evaluation.prompts_per_batch", self.prompts_per_batch)
        check_number("evaluation.success_threshold", self.success_threshold)
        if not isinstance(self.pass_k, (list, tuple)):
            fail("evaluation.pass_k", "a list of positive integers", self.pass_k)
        for k in self.pass_k:
            check_int("evaluation.pass_k", k, maximum=self.n_samples)


@dataclass(frozen=True)
class SampleLogConfig:
    """Sampled responses logged as text (TensorBoard's TEXT tab)."""

    every_n_steps: int = 50
    """log a table of responses every this many training steps, the first step included
    (0: never)"""
    count: int = 4
    """prompts shown per table (the first response of each)"""
    heatmap_groups: int = 2
    """prompt groups drawn in each advantage heatmap (train/advantage_heatmap, IMAGES tab;
    groups whose rewards differ first; 0: no heatmaps)"""
    heatmap_responses: int = 4
    """responses drawn per prompt group (validation: the greedy one and samples; a tree
    batch (``ppo.tree``): its first leaves in path order, each shared prefix drawn once)"""

    def __post_init__(self) -> None:
        check_int("sample_log.every_n_steps", self.every_n_steps, minimum=0)
        check_int("sample_log.count", self.count)
        check_int("sample_log.heatmap_groups", self.heatmap_groups, minimum=0)
        check_int("sample_log.heatmap_responses", self.heatmap_responses)

    def due(self, step: int) -> bool:
        return self.every_n_steps > 0 and step % self.every_n_steps == 0


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
    loss_agg_mode: Optional[str] = None
    """how per-token losses become one number (verl's agg_loss): token-mean, token-sum,
    seq-mean-token-sum, seq-mean-token-mean or seq-mean-token-sum-norm (Dr.GRPO: token
    sums averaged over sequences, divided by loss_scale_factor); null: token-mean, or the
    policy loss's own (sapo, geo_mean)"""
    policy_loss: str = "vanilla"
    """the policy loss (verl's actor.policy_loss.loss_mode): vanilla, gspo, cispo, sapo,
    geo_mean, dppo_tv, dppo_kl, clip_cov, kl_cov, dro, gpg, vespo, a name registered with
    register_policy_loss, or a dotted path"""
    policy_loss_kwargs: dict[str, Any] = field(default_factory=dict)
    """its settings, verl's names (tau_pos, tau_neg, clip_cov_ratio, clip_cov_lb,
    clip_cov_ub, kl_cov_ratio, ppo_kl_coef, dro_beta)"""
    loss_scale_factor: Optional[float] = None
    """the constant divisor of seq-mean-token-sum-norm (null: the episode's token budget,
    max_new_tokens x the task's turns)"""
    ratio_level: str = "token"
    """importance ratio per token (PPO) or per sequence (GSPO)"""
    kl_loss_coef: float = 0.0
    """weight of a KL-to-reference term in the loss (GRPO's beta); the reward-side KL
    penalty is actor.kl_ctl. Either > 0 loads a frozen reference policy"""
    kl_loss_estimator: str = "k3"
    """estimator of the KL loss term: k1, k2, k3 (= low_var_kl), abs, or verl's
    straight-through k1+, k3+ (the value of k1/k3, the gradient of k2)"""
    use_bias_correction_kl: bool = False
    """weight the KL loss term by pi_theta/pi_old (TRL's use_bias_correction_kl)"""
    off_policy_steps: int = 0
    """train on the rollout sampled this many training steps ago (a queue): every batch is
    this many policy versions stale; the first steps only sample"""
    rollout_dtype: Optional[str] = None
    """sample with a copy of the policy in this dtype (bfloat16, float16, float32),
    refreshed every step: a training/inference mismatch (null: the policy itself)"""
    rollout_correction: Optional[RolloutCorrectionConfig] = None
    """verl's algorithm.rollout_correction: {rollout_is, rollout_is_threshold,
    rollout_is_batch_normalize, rollout_rs, rollout_rs_threshold, bypass_mode, loss_type};
    decoupled mode needs actor.recompute_logprob: true (null: no correction)"""
    rollout_kl_coef: float = 0.0
    """weight of a KL(pi_theta || pi_rollout) loss term"""
    rollout_kl_estimator: str = "k3"
    """its estimator (as kl_loss_estimator)"""
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
    echo_ce_coef: float = 0.0
    """weight of a cross-entropy term on the environment's replies (tool outputs: tokens
    after a row's first generated one that the policy did not generate), a token mean over
    them, beside the RL term and out of its mask (ECHO); needs a multi-turn task"""
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
    vine: Optional[VineConfig] = None
    """VinePPO's Monte Carlo step values for estimator vine: {k, boundaries, every_n_tokens,
    low_prob}; k continuations sampled from each step boundary of every response, scored
    by the task, never trained on (null: none sampled)"""
    tree: Optional[TreeConfig] = None
    """tree rollouts for the tree estimators (tree_grpo, treepo, treerl): {segment_tokens,
    branches, depth, branch_at: fixed | entropy}; each prompt's n_samples = branches ** depth
    responses share their prefixes, each sampled once (null: independent responses)"""

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
        for name in ("weight_decay", "value_coef", "entropy_coef", "kl_loss_coef",
                     "echo_ce_coef"):
            check_number(f"ppo.{name}", getattr(self, name), minimum=0.0)
        check_choice("ppo.loss_agg_mode", self.loss_agg_mode, (None, *LOSS_AGG_MODES))
        check_choice("ppo.ratio_level", self.ratio_level, RATIO_LEVELS)
        check_choice("ppo.kl_loss_estimator", self.kl_loss_estimator, LOSS_KL_ESTIMATORS)
        self._check_off_policy()
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
        vine = nested_config(VineConfig, "ppo.vine", self.vine)
        if vine is not None and not isinstance(vine, VineConfig):
            fail("ppo.vine", "null or {k, boundaries, every_n_tokens, low_prob}", vine)
        convert_field(self, "vine", vine)
        self._check_tree()
        if self.forward_batch_size is not None and not is_int(self.forward_batch_size, 1):
            fail("ppo.forward_batch_size", "null (the whole rollout batch) or a positive "
                 "integer (rows per scoring forward pass)", self.forward_batch_size)
        if self.micro_batch_size is not None and not is_int(self.micro_batch_size, 1):
            fail("ppo.micro_batch_size", "null (the whole minibatch) or a positive integer "
                 "(rows per forward and backward pass of the update)", self.micro_batch_size)
        for name in ("value_clip_eps", "max_grad_norm"):
            if getattr(self, name) is not None:
                check_number(f"ppo.{name}", getattr(self, name), positive=True)

    def _check_tree(self) -> None:
        tree = nested_config(TreeConfig, "ppo.tree", self.tree)
        if tree is not None and not isinstance(tree, TreeConfig):
            fail("ppo.tree", "null or {segment_tokens, branches, depth, branch_at}", tree)
        convert_field(self, "tree", tree)
        if tree is not None and self.n_samples != tree.leaves:
            fail("ppo.n_samples", f"ppo.tree's leaves per prompt, branches ** depth = "
                 f"{tree.branches} ** {tree.depth} = {tree.leaves}", self.n_samples)
        if tree is not None and self.vine is not None:
            fail("ppo.tree", "null with ppo.vine (continuations are sampled from independent "
                 "responses' step boundaries, not from a tree's)", "a tree")

    def _check_off_policy(self) -> None:
        if not isinstance(self.policy_loss, str):
            fail("ppo.policy_loss", "a policy loss name or a dotted path", self.policy_loss)
        check_json_kwargs("ppo.policy_loss_kwargs", self.policy_loss_kwargs)
        check_bool("ppo.use_bias_correction_kl", self.use_bias_correction_kl)
        check_int("ppo.off_policy_steps", self.off_policy_steps, minimum=0)
        check_choice("ppo.rollout_dtype", self.rollout_dtype, (None, *ROLLOUT_DTYPES))
        check_number("ppo.rollout_kl_coef", self.rollout_kl_coef, minimum=0.0)
        check_choice("ppo.rollout_kl_estimator", self.rollout_kl_estimator, LOSS_KL_ESTIMATORS)
        correction = nested_config(RolloutCorrectionConfig, "ppo.rollout_correction",
                                   self.rollout_correction)
        if correction is not None and not isinstance(correction, RolloutCorrectionConfig):
            fail("ppo.rollout_correction", "null or a mapping of verl's rollout_correction keys",
                 correction)
        convert_field(self, "rollout_correction", correction)

    @property
    def off_policy(self) -> bool:
        """The batch carries the sampler's log-probs and the run logs ``offpolicy/``."""
        return (self.off_policy_steps > 0 or self.rollout_dtype is not None
                or self.rollout_correction is not None or self.rollout_kl_coef > 0)


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


def coerce_config(cls: type, value: Any, key: str) -> Any:
    """A config dataclass from itself or a mapping (hparams of a checkpoint are mappings)."""
    if value is None:
        return cls()
    value = nested_config(cls, key, value)
    if isinstance(value, cls):
        return value
    raise TypeError(f"{key}: expected a {cls.__name__} or a mapping, got {type(value).__name__}")



def module_hparams(sections: dict[str, Any], advantage_module: str, seed: Optional[int]
                   ) -> dict[str, Any]:
    """The module's hyper-parameters as plain YAML types (what checkpoints store), from its
    config ``sections`` (name -> dataclass, in the module's argument order)."""
    names = list(sections)
    out = {name: dataclasses.asdict(sections[name]) for name in names[:5]}
    out.update(advantage_module=advantage_module, seed=seed)
    out.update({name: dataclasses.asdict(sections[name]) for name in names[5:]})
    return out
