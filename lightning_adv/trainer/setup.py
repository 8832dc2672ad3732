"""One setup plan for the trainer: every config coerced once, every setup check run once.

:meth:`TrainerPlan.build` is what both :class:`~lightning_adv.trainer.ppo.PPOModule` and
the CLI's pre-flight check (:func:`validate_model_config`, before anything runs) call, so
the two run the same checks in the same order and cannot drift apart:

1. the config sections (``actor``, ``policy``, ``ppo``, ``task``, ``prm``,
   ``kl_controller``, ``evaluation``, ``sample_log``), from dataclasses or mappings;
2. combinations the trainer cannot run (:func:`check_trainer_options`) and a value head
   next to a critic-free recipe (:func:`warn_unused_critic`, a warning);
3. a Hugging Face policy's files, tokenizer and dtype (no weights loaded), or the
   built-in policy's sampler options
   (:func:`~lightning_adv.trainer.policies.build.check_policy_options`);
4. the task with its tokenizer and sequence budget (:func:`task_runtime`), its first
   prompts (a dataset's every line), the length penalty's budget and the shape of one
   step's rollout over the ranks (:func:`check_rollout_shape`);
5. the process scorers (every configured path resolved), the advantage module with its
   stages, the greedy baseline's reader, and the loss.

Building the plan builds no network: the policies come from
:meth:`TrainerPlan.build_policies`, which only the module calls.
"""

from __future__ import annotations

import inspect
import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from lightning_adv.config import ActorConfig, check_process_mode, critic_free_reason
from lightning_adv.stages.registry import selected_stage
from lightning_adv.dotted_path import is_dotted_path
from lightning_adv.dotted_path import import_object, resolve_callable
from lightning_adv.losses.kl_controllers import KLControllerConfig
from lightning_adv.advantage.module import AdvantageModule
from lightning_adv.losses.ppo_loss import PPOLoss
from lightning_adv.trainer.config import PPOConfig, PRMConfig, coerce_config, module_hparams
from lightning_adv.trainer.data import derive_seed
from lightning_adv.trainer.logs.evaluation import EvalConfig
from lightning_adv.trainer.policies.base import Policy
from lightning_adv.trainer.policies.build import PolicySetup, build_policy, check_policy_options
from lightning_adv.trainer.policies.config import PolicyConfig
from lightning_adv.trainer.rollout.recipe_inputs import check_greedy_baseline
from lightning_adv.trainer.rollout.tree import check_tree_options
from lightning_adv.trainer.rollout.vine import check_vine_options
from lightning_adv.trainer.logs.sample_log import SampleLogConfig
from lightning_adv.trainer.rollout.batch import Scorer
from lightning_adv.trainer.tasks.runtime import TaskConfig, TaskRuntime
from lightning_adv.trainer.update import build_loss

#: the ``model`` section's config dataclasses, in the order they are coerced (and checked)
SECTIONS: dict[str, type] = {
    "actor": ActorConfig, "policy": PolicyConfig, "ppo": PPOConfig, "task": TaskConfig,
    "prm": PRMConfig, "kl_controller": KLControllerConfig, "evaluation": EvalConfig,
    "sample_log": SampleLogConfig}

DEFAULT_ADVANTAGE_MODULE = "lightning_adv.AdvantageModule"

#: the CLI's pre-flight plan, by config (:meth:`TrainerPlan.keep_for_module`)
_PREFLIGHT: dict[str, "TrainerPlan"] = {}


def config_key(values: Mapping[str, Any]) -> str:
    """The ``model`` section ``values`` as a canonical string: equal for the CLI's mappings
    and the module's dataclasses of the same config."""
    with warnings.catch_warnings():  # (the plan's build has warned about them already)
        warnings.simplefilter("ignore")
        sections = {name: coerce_config(kind, values.get(name), name)
                    for name, kind in SECTIONS.items()}
    path = values.get("advantage_module") or DEFAULT_ADVANTAGE_MODULE
    return json.dumps(module_hparams(sections, path, values.get("seed")), sort_keys=True,
                      default=repr)


@dataclass(frozen=True)
class TrainerPlan:
    """A checked ``PPOModule`` config and what its setup derives from it."""

    actor: ActorConfig
    policy: PolicyConfig
    ppo: PPOConfig
    task: TaskConfig
    prm: PRMConfig
    kl_controller: KLControllerConfig
    evaluation: EvalConfig
    sample_log: SampleLogConfig
    advantage_module: str
    """dotted path of the AdvantageModule (sub)class"""
    seed: Optional[int]
    policy_setup: PolicySetup
    """the policy's tokenizer and context window (and a Hugging Face policy's checked files)"""
    runtime: TaskRuntime
    max_new_tokens: int
    """tokens per policy turn"""
    max_len: int
    """the built-in policy's sequence length"""
    scorers: list[Scorer]
    """the process scorers to run (none unless prm.enabled)"""
    advantage: AdvantageModule
    loss: PPOLoss

    @classmethod
    def build(cls, values: Mapping[str, Any], world_size: int = 1) -> TrainerPlan:
        """Coerce and check the ``model`` section ``values`` (dataclasses or mappings) for a
        run on ``world_size`` ranks. Raises ``ValueError`` (or ``TypeError``) naming the
        key (``actor.advantage.estimator: ...``); a task function's bad output is a
        :class:`~lightning_adv.trainer.tasks.TaskError`. Its warnings (stacklevel 4) point
        at the line that built the ``PPOModule`` or called :func:`validate_model_config`."""
        configs = {name: coerce_config(kind, values.get(name), name)
                   for name, kind in SECTIONS.items()}
        actor, policy, ppo, task, prm = (configs[name] for name in
                                         ("actor", "policy", "ppo", "task", "prm"))
        check_trainer_options(actor, prm, configs["kl_controller"])
        check_off_policy_options(actor, ppo)
        warn_unused_critic(actor, policy)
        policy_setup = check_policy_options(policy, ppo, task)
        evaluation = configs["evaluation"]
        runtime, max_new_tokens, max_len = task_runtime(task, ppo, policy, policy_setup,
                                                        actor.unscorable_rewards,
                                                        held_out=2 * evaluation.num_prompts)
        # A dataset's every line (a missing prompt, one too long for the model) fails here,
        # before training; drawn tasks check the prompts of the first steps.
        runtime.check_prompts(None if task.dataset is not None else ppo.prompts_per_step)
        check_length_penalty(actor, runtime, max_new_tokens)
        check_evaluation_sets(evaluation, runtime, ppo)
        check_rollout_shape(actor, ppo, task, runtime, world_size)
        scorers = resolve_scorers(prm)
        path = values.get("advantage_module") or DEFAULT_ADVANTAGE_MODULE
        advantage = build_advantage_module(path, actor)
        check_greedy_baseline(advantage.required_batch_keys, ppo.greedy_baseline)
        check_vine_options(advantage.required_batch_keys, actor, ppo, prm, runtime)
        check_tree_options(advantage.required_batch_keys, ppo, runtime)
        loss = build_loss(ppo, max_new_tokens * runtime.task.max_turns)
        return cls(**configs, advantage_module=path, seed=values.get("seed"),
                   policy_setup=policy_setup,
                   runtime=runtime, max_new_tokens=max_new_tokens, max_len=max_len,
                   scorers=scorers, advantage=advantage, loss=loss)

    @property
    def hparams(self) -> dict[str, Any]:
        """The module's hyper-parameters as plain YAML types (what checkpoints store)."""
        return module_hparams({name: getattr(self, name) for name in SECTIONS},
                              self.advantage_module, self.seed)

    @classmethod
    def for_module(cls, values: Mapping[str, Any]) -> TrainerPlan:
        """The plan of a ``PPOModule`` built from ``values``: the one the CLI's pre-flight
        check built for the same config (taken, so a run builds its plan once: the dataset
        scan, the tokenizer, the stages), else a new one."""
        return _PREFLIGHT.pop(config_key(values), None) or cls.build(values)

    def keep_for_module(self, values: Mapping[str, Any]) -> None:
        """Hand this plan (built from ``values``) to the ``PPOModule`` built next from the same
        config (:meth:`for_module`)."""
        _PREFLIGHT.clear()
        _PREFLIGHT[config_key(values)] = self

    @property
    def prm_shaping(self) -> Any:
        """The call-time process shaping passed to the advantage module (None: prm off)."""
        return self.prm.advantage_shaping if self.prm.enabled else None

    @property
    def needs_reference(self) -> bool:
        """A KL term (reward penalty or loss) or a stage reading ``ref_logp`` needs the
        frozen reference policy."""
        return (self.actor.kl_ctl > 0 or self.ppo.kl_loss_coef > 0
                or "ref_logp" in self.advantage.required_batch_keys)

    def build_policies(self, seed: int) -> tuple[Policy, Any]:
        """The policy and, when a KL term needs it, the frozen reference (under LoRA the
        policy with its adapters disabled). The initial weights come from ``seed`` (the
        run's): the same seed, the same policy."""
        policy = build_policy(self.policy, self.policy_setup, self.runtime.vocab, self.max_len,
                              derive_seed(seed, "init"))
        return policy, policy.reference() if self.needs_reference else None


def validate_model_config(values: Mapping[str, Any],
                          trainer: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """The CLI's pre-flight check of a ``PPOModule`` config (the ``model`` section), without
    building any network: :meth:`TrainerPlan.build` over ``trainer``'s ranks (when
    given). Raises ``ValueError`` naming the key; returns the module's hyper-parameters as
    its checkpoints store them."""
    return TrainerPlan.build(values, world_size_of(trainer)).hparams


def build_advantage_module(path: str, actor: ActorConfig) -> AdvantageModule:
    """Import the ``advantage_module`` class, check it, and build it (resolving stages)."""
    cls = import_object(path, "advantage_module") if is_dotted_path(path) else None
    if not (isinstance(cls, type) and issubclass(cls, AdvantageModule)):
        raise ValueError(f"advantage_module: expected the dotted path of an AdvantageModule "
                         f"subclass, got {path!r}" + (f" ({cls!r})" if cls is not None else ""))
    parameters = inspect.signature(cls.forward).parameters
    if "kl_coef" not in parameters and not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        # The trainer passes its KL controller's coefficient with every call.
        raise ValueError(f"advantage_module: {path!r} overrides forward without the keyword "
                         f"argument kl_coef; declare forward(self, batch, meta=None, *, "
                         f"prm=None, kl_coef=None) and pass kl_coef on to super().forward")
    return cls(actor)


def resolve_scorers(prm: PRMConfig) -> list[Scorer]:
    """The process scorers to run, as (key, function, weight, kwargs): none unless
    ``prm.enabled``, but every configured path is resolved (and its kwargs checked) either
    way, so a typo fails before training."""
    scorers = [(f"prm.scorers[{i}] {s.path!r}",
                resolve_callable(s.path, s.kwargs, f"prm.scorers[{i}].path"),
                float(s.weight), dict(s.kwargs))
               for i, s in enumerate(prm.scorers)]
    return scorers if prm.enabled else []


def task_runtime(task: TaskConfig, ppo: PPOConfig, policy: PolicyConfig, setup: PolicySetup,
                 unscorable_rewards: str = "error", held_out: int = 0
                 ) -> tuple[TaskRuntime, int, int]:
    """The task with its tokenizer (the character vocabulary, or the policy's tokenizer of
    ``setup``), the tokens per policy turn and the built-in policy's sequence length; under
    ``unscorable_rewards: exclude`` its reward may be None or NaN (unscorable); a dataset
    keeps its last ``held_out`` lines for evaluation unless ``task.num_prompts`` is set.
    Where the policy's context window is known, every prompt must leave room in it for the
    episode: every turn's limit and the replies between (counted in the task's symbols; a
    chat template's framing is checked while sampling)."""
    runtime = TaskRuntime(task, tokenizer=setup.tokenizer,
                          unscorable_rewards=unscorable_rewards, held_out=held_out)
    max_new_tokens, max_len = sequence_budget(runtime, ppo, policy)
    if setup.context_window is not None:
        t = runtime.task
        runtime.context_window = setup.context_window
        runtime.episode_budget = t.max_turns * max_new_tokens + (t.max_turns - 1) * t.max_reply_len
    return runtime, max_new_tokens, max_len


def warn_unused_critic(actor: ActorConfig, policy: PolicyConfig) -> None:
    """A critic-free recipe with a value head: GAE would subtract the critic's values on top
    of the recipe's own baseline (or train a critic nobody reads)."""
    reason = critic_free_reason(actor)
    if policy.value_head and reason is not None:
        warnings.warn(f"policy.value_head: true, but {reason}; the critic's values are subtracted "
                      f"as a second baseline or trained for nothing. Set model.policy.value_head: "
                      f"false for a critic-free recipe", UserWarning, stacklevel=4)


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


def check_trainer_options(actor: ActorConfig, prm: PRMConfig,
                          kl_controller: KLControllerConfig = KLControllerConfig()) -> None:
    """Combinations the trainer cannot run, caught before training; errors name the key."""
    if prm.scorers and not prm.enabled:
        warnings.warn("prm.scorers: process scorers are configured but prm.enabled is false, so "
                      "they are not run; set prm.enabled: true to use them", stacklevel=4)
    if kl_controller.type == "adaptive" and actor.kl_ctl == 0:
        raise ValueError("kl_controller.type: the adaptive controller scales actor.kl_ctl, which "
                         "is 0 (it would stay 0); set actor.kl_ctl > 0 or use type 'fixed'")
    process = actor.advantage.process_adv_shaping
    if prm.enabled and not actor.advantage.is_replaced and (
            process is None or process.implementation == "auto"):
        # The call-time mode is used: check it against the actor now, not at step 1.
        check_process_mode("prm.advantage_shaping.mode", prm.advantage_shaping.mode, actor)
    if actor.use_decoupled_loss:
        raise ValueError("actor.use_decoupled_loss: the built-in trainer's decoupled loss is "
                         "ppo.rollout_correction (bypass_mode: false, with "
                         "actor.recompute_logprob: true): the IS weight pi_old/pi_rollout "
                         "multiplies the policy term; set use_decoupled_loss to false")


def check_off_policy_options(actor: ActorConfig, ppo: PPOConfig) -> None:
    """Off-policy settings the trainer cannot honour, caught before training."""
    correction = ppo.rollout_correction
    if correction is None:
        return
    if not correction.bypass_mode and not actor.recompute_logprob:
        raise ValueError("ppo.rollout_correction: decoupled mode (bypass_mode: false) weights "
                         "pi_old/pi_rollout, so the old log-probs must be recomputed by the "
                         "trained policy: set actor.recompute_logprob: true (or bypass_mode: "
                         "true to take the rollout's log-probs as the old ones)")
    if correction.bypass_mode and actor.recompute_logprob:
        raise ValueError("actor.recompute_logprob: bypass mode (ppo.rollout_correction."
                         "bypass_mode: true) takes the rollout's log-probs as the old ones; "
                         "recomputed ones would replace them. Set it to false, or bypass_mode "
                         "to false (decoupled mode)")


def group_settings(actor: ActorConfig) -> list[str]:
    """The actor's settings that compare the responses of one prompt group."""
    found = [f"actor.{name}.{level}" for name in ("reward_norm", "adv_norm")
             for level in ("mean_level", "std_level")
             if getattr(actor, name) is not None and getattr(getattr(actor, name), level) == "group"]
    outcome = selected_stage(actor, "outcome_reward_shaping")
    if outcome is not None and outcome.baseline == "group":  # registered as a group baseline
        found.append(f"actor.advantage.outcome_reward_shaping ({outcome.name!r})")
    return found


def check_evaluation_sets(evaluation: EvalConfig, runtime: TaskRuntime, ppo: PPOConfig) -> None:
    """A dataset (a fixed pool) must leave prompts for training and for both evaluation
    sets (validation, then test) after them; a drawn task always can."""
    pool, train, wanted = runtime.task.pool_size, runtime.num_prompts, evaluation.num_prompts
    if pool is None:
        return
    if runtime.config.num_prompts is None and train < ppo.prompts_per_step:
        raise ValueError(f"task.dataset: its {pool} prompts, less the 2 x evaluation.num_prompts "
                         f"({2 * wanted}) held out for evaluation, leave {train} for training, "
                         f"fewer than one step's ppo.prompts_per_step ({ppo.prompts_per_step}); "
                         f"lower evaluation.num_prompts (0: no evaluation) or set task.num_prompts")
    left = max(pool - train, 0)
    if wanted and min(wanted, left - min(wanted, left)) == 0:
        which = "the validation and test sets are" if left == 0 else "the test set is"
        raise ValueError(f"task.num_prompts: the dataset's {pool} prompts leave {left} for "
                         f"evaluation after the {train} training ones, so {which} empty; set "
                         f"task.num_prompts: null (the last 2 x evaluation.num_prompts = "
                         f"{2 * wanted} lines are held out) or at most {pool - 2} here, or "
                         f"evaluation.num_prompts: 0 to train without evaluation")


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
    # A tree whose every path ends in its first segment leaves `branches` rows per prompt.
    per_prompt, what = ((ppo.n_samples, "ppo.n_samples") if ppo.tree is None else
                        (ppo.tree.branches, "ppo.tree.branches, a tree whose paths all end early"))
    rows = ppo.prompts_per_step // max(world_size, 1) * per_prompt
    if ppo.minibatches > rows:
        raise ValueError(f"ppo.minibatches: each minibatch needs at least one row, and a step has "
                         f"{rows} rows per rank (ppo.prompts_per_step {ppo.prompts_per_step} / "
                         f"{world_size} rank(s) x {what} {per_prompt}), got "
                         f"{ppo.minibatches}")
    if ppo.tree is not None and ppo.micro_batch_size is not None and world_size > 1:
        # the micro-batches of a minibatch follow its rows, which a tree makes differ
        # between ranks, and each micro-batch's loss is a collective
        raise ValueError(f"ppo.micro_batch_size: with ppo.tree the ranks hold different "
                         f"numbers of rows, so their micro-batches would not pair up across the "
                         f"{world_size} ranks; set it to null (whole minibatches), got "
                         f"{ppo.micro_batch_size}")
    estimator = selected_stage(actor, "estimator")
    if estimator is not None and "turn_ids" in estimator.requires and runtime.task.max_turns < 2:
        spec = actor.advantage.estimator
        key = ("actor.advantage.estimator" if spec is not None and spec.implementation != "auto"
               else "actor.gae_timestep_unit")
        raise ValueError(f"{key}: turn-level GAE needs a multi-turn task (the batch's turn_ids), "
                         f"and task {task.name!r} has one turn per episode; use estimator "
                         f"token_gae or a multi-turn task (guess)")
    if ppo.echo_ce_coef > 0 and runtime.task.max_turns < 2:
        raise ValueError(f"ppo.echo_ce_coef: the cross-entropy term trains on the environment's "
                         f"replies (tool outputs) between policy turns, and task {task.name!r} "
                         f"has one turn per episode (no replies); use a multi-turn task "
                         f"(calculator, guess) or set it to 0, got {ppo.echo_ce_coef}")


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
