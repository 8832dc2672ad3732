"""``AdvantageModule``: the advantage pipeline of the design note as a ``torch.nn.Module``.

The stages are child modules (``outcome``, ``estimator``, ``process``; or ``compute`` for
a full replacement). :meth:`AdvantageModule.compute_default` holds the pipeline order;
each stage is reached through one overridable method, so a subclass can replace a stage
by overriding ``shape_outcome``, ``estimate`` or ``shape_process`` (or ``forward``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from lightning_adv._checks import check_number, warn_caller
from lightning_adv.advantage.alignment import (
    AlignedBatch, align_batch, optional_outputs, place_outcome, temporal_inputs)
from lightning_adv.advantage.multi_reward import combine_reward_components
from lightning_adv.advantage.normalization import (
    check_group_members, norm_errors, normalize, normalize_outcome_rewards)
from lightning_adv.advantage.reward_terms import apply_length_penalty, apply_truncated_reward
from lightning_adv.advantage.unscorable_rows import (
    check_some_row_scored, merge_rows, replace_rows, select_meta, select_rows, unscorable_rows)
from lightning_adv.batch.grouping import BatchMeta
from lightning_adv.batch.validation import (
    BatchFacts, reference_logp_problem, unused_process_stage, validate_batch)
from lightning_adv.config import ActorConfig, PRMAdvantageShapingConfig
from lightning_adv.distributed import check_peers, contributing_nothing, report_failure
from lightning_adv.exceptions import IgnoredSettingWarning, MissingRefLogpWarning, PeerRankFailed
from lightning_adv.stages.contract_checks import (
    StageContractCheck, check_advantage_result, check_outcome_result, check_process_result,
    check_temporal_result)
from lightning_adv.stages.gae_lambda import resolve_lambda_fn
from lightning_adv.stages.process import resolve_process_mode
from lightning_adv.stages.registry import STAGES, StageEntry, builtin_stage
from lightning_adv.stages.resolve import Stage, resolve_stage
from lightning_adv.stages.types import (
    AdvantageInputs, OutcomeResult, OutcomeRewardInputs, ProcessAdvantageInputs, TemporalInputs,
    TemporalResult, read_only)


class AdvantageModule(nn.Module):
    """Computes advantages, returns and rewards for a rollout batch (SPEC §3, §5).

    ``module(batch, meta=None, *, prm=None, kl_coef=None)`` returns a new dict: the input
    keys plus
    ``advantages``, ``returns``, ``loss_mask`` (aligned float), ``logprobs`` (aligned,
    masked), ``rewards`` (outcome rewards after the length penalty and outcome shaping),
    ``tot_rewards``, ``kl_rewards``, ``is_truncated``, ``input_token_loss_mask`` (the
    unshifted mask), ``prox_logp`` (unless decoupled), ``ref_logp`` (masked, when given)
    and ``mopd_behavior_logprobs`` (under MOPD); with ``adv_norm`` set, also
    ``unnormalized_advantages`` (the estimator's advantages before advantage normalization,
    for logging). Input tensors are never modified; keys the
    pipeline does not produce are passed through as the same tensor objects.

    ``kl_coef`` is the KL penalty's coefficient for this call; None means
    ``config.kl_ctl``. A trainer whose KL controller moves the coefficient passes the
    controller's value each step (the controller is the coefficient's one owner; the
    config holds its initial value).

    Everything runs under ``torch.no_grad()``: advantages and returns are targets.
    """

    def __init__(self, config: ActorConfig | Mapping[str, Any] | None = None):
        super().__init__()
        if config is None:
            config = ActorConfig()
        elif isinstance(config, Mapping):
            config = ActorConfig(**config)
        elif not isinstance(config, ActorConfig):
            raise TypeError(f"AdvantageModule: expected an ActorConfig, got {type(config).__name__}")
        self.config = config
        self._warned: set[str] = set()  # the once-per-module warnings already given
        advantage = config.advantage
        if advantage.is_replaced:
            self.compute = resolve_stage("compute", advantage.compute, config)
        else:
            self.outcome = resolve_stage("outcome_reward_shaping",
                                         advantage.outcome_reward_shaping, config)
            self.estimator = resolve_stage("estimator", advantage.estimator, config)
            self.process = resolve_stage("process_adv_shaping", advantage.process_adv_shaping, config)
        if isinstance(config.gae_lambda, str):
            resolve_lambda_fn(config.gae_lambda, config.gae_lambda_kwargs, "actor.gae_lambda")

    @property
    def required_batch_keys(self) -> frozenset[str]:
        """Optional batch keys the configured named stages read (their
        ``register_stage(requires=...)``), e.g. ``sum_pi_squared`` or ``reward_baselines``:
        a trainer computes them only when some stage asks."""
        keys: set[str] = set()
        for name in ("outcome", "estimator", "process"):
            entry = _entry(getattr(self, name, None))
            if entry is not None:
                keys.update(entry.requires)
        return frozenset(keys)

    @property
    def optional_batch_keys(self) -> frozenset[str]:
        """Optional batch keys the configured stages read when the batch has them (their
        ``register_stage(reads=...)``), e.g. ``rollout_is_weights``: a trainer passes them
        when it has them."""
        keys: set[str] = set()
        for name in ("outcome", "estimator", "process"):
            entry = _entry(getattr(self, name, None))
            if entry is not None:  # built-in or registered by name (a dotted path declares nothing)
                keys.update(entry.reads)
        return frozenset(keys)

    # ------------------------------------------------------------------ entry point

    @torch.no_grad()
    def forward(self, batch: Mapping[str, Any], meta: Optional[BatchMeta] = None, *,
                prm: Optional[PRMAdvantageShapingConfig] = None,
                kl_coef: Optional[float] = None) -> dict[str, Any]:
        if kl_coef is None:
            kl_coef = self.config.kl_ctl
        check_number("AdvantageModule kl_coef", kl_coef, minimum=0.0)
        kl_coef = float(kl_coef)
        try:
            unscorable = unscorable_rows(batch, self.config)
            check_some_row_scored(unscorable, batch, self.config)
            if unscorable is None:
                out = self._compute(batch, meta, prm, kl_coef)
            elif bool(unscorable.all()):  # DDP only: another rank holds scored rows
                out = self.compute_for_peers(batch, meta, prm, kl_coef, unscorable)
            else:
                out = self.compute_without_rows(batch, meta, prm, kl_coef, unscorable)
        except PeerRankFailed:
            raise
        except Exception:
            # Under DDP the other ranks may be waiting in a collective: let them fail too.
            report_failure(_device_of(batch))
            raise
        check_peers(_device_of(batch))  # a peer may have failed after this rank's last collective
        return out

    def _compute(self, batch: Mapping[str, Any], meta: Optional[BatchMeta],
                 prm: Optional[PRMAdvantageShapingConfig], kl_coef: float) -> dict[str, Any]:
        batch = combine_reward_components(batch, meta, self.config)
        facts = validate_batch(batch, meta, self.config)
        replaced = self.config.advantage.is_replaced
        # Check the call-time prm before any work (its mode is resolved per stage call).
        resolve_process_mode(prm, self.config, None if replaced else self.process)
        compute = self.compute_replacement if replaced else self.compute_default
        out = compute(batch, meta, prm, facts, kl_coef)
        if self.config.unscorable_rewards == "exclude":
            out["unscorable"] = torch.zeros(facts.batch_size, dtype=torch.bool, device=facts.device)
        return out

    def compute_without_rows(self, batch: Mapping[str, Any], meta: Optional[BatchMeta],
                             prm: Optional[PRMAdvantageShapingConfig], kl_coef: float,
                             unscorable: Tensor) -> dict[str, Any]:
        """``actor.unscorable_rewards: exclude``: the pipeline on the scorable rows only,
        then the unscorable rows put back with advantage 0 (:mod:`lightning_adv.advantage.unscorable_rows`)."""
        if meta is None:
            _check_no_fixed_slices(self.config)
        kept = ~unscorable
        selected = select_rows(batch, kept)
        out = self._compute(selected, select_meta(meta, kept), prm, kl_coef)
        merged = merge_rows(batch, selected, out, kept, self.unscorable_filler(batch, unscorable))
        merged["unscorable"] = unscorable
        return merged

    def compute_for_peers(self, batch: Mapping[str, Any], meta: Optional[BatchMeta],
                          prm: Optional[PRMAdvantageShapingConfig], kl_coef: float,
                          unscorable: Tensor) -> dict[str, Any]:
        """Every row of this rank unscorable while a DDP peer holds scored rows: the
        pipeline runs on a stand-in (rewards 0) contributing nothing to the collectives,
        so the peers' statistics are their rows' alone and no collective is left waiting;
        its numbers are thrown away and every row comes back unscorable (advantage 0)."""
        rewards = batch["rewards"]
        stand_in = {**batch, "rewards": torch.where(rewards.isnan(), 0.0, rewards)}
        with contributing_nothing():
            stand_out = self._compute(stand_in, meta, prm, kl_coef)
        out = replace_rows(batch, stand_in, stand_out, self.unscorable_filler(batch, unscorable))
        out["unscorable"] = unscorable
        return out

    def unscorable_filler(self, batch: Mapping[str, Any], unscorable: Tensor) -> dict[str, Tensor]:
        """The output rows of the ``unscorable`` rows: advantage, KL and total rewards 0,
        returns their own values (no critic signal), their real aligned loss mask and
        log-probs (they count in token means like any zero-advantage row)."""
        dropped = select_rows(batch, unscorable)
        dropped["rewards"] = torch.zeros(int(unscorable.sum()), device=unscorable.device)
        facts = validate_batch(dropped, None, self.config)
        aligned = align_batch(dropped, facts, self.config, kl_coef=0.0)
        zeros = torch.zeros_like(aligned.loss_mask)
        filler = {"loss_mask": aligned.loss_mask, "logprobs": aligned.old_logp,
                  "returns": aligned.values * aligned.loss_mask, "ref_logp": aligned.ref_logp,
                  "is_truncated": aligned.is_truncated, "input_token_loss_mask": dropped["loss_mask"],
                  "advantages": zeros, "tot_rewards": zeros, "kl_rewards": zeros,
                  "rewards": torch.zeros_like(dropped["rewards"])}
        filler.update(optional_outputs(aligned))
        return filler

    def compute_default(self, batch: Mapping[str, Any], meta: Optional[BatchMeta],
                        prm: Optional[PRMAdvantageShapingConfig], facts: BatchFacts,
                        kl_coef: float) -> dict[str, Any]:
        """The default pipeline, in the design note's order."""
        config = self.config
        self._check_settings_against(batch, kl_coef)
        penalized = apply_truncated_reward(
            apply_length_penalty(batch["rewards"], batch["loss_mask"], config),
            facts.is_truncated, config)
        data = read_only({**batch, "rewards": penalized})
        outcome = self.shape_outcome(OutcomeRewardInputs(data, config, meta))
        scores = self.normalize_rewards(outcome, batch["rewards"], meta)
        aligned, temporal = self.align_and_estimate(batch, facts, scores, meta, data, kl_coef)
        advantages = self.normalize_advantages(temporal.advantages, aligned.loss_mask, meta)
        advantages = self.shape_process(ProcessAdvantageInputs(
            advantages, aligned.direct_token_rewards, aligned.loss_mask, config, meta, data), prm)
        out = self._output(batch, aligned, advantages, temporal, outcome.rewards)
        if self.config.adv_norm is not None:
            out["unnormalized_advantages"] = temporal.advantages
        return out

    # ------------------------------------------------------------------ stages

    def shape_outcome(self, inputs: OutcomeRewardInputs) -> OutcomeResult:
        """Outcome shaping stage: one reward per row (and optional logical references)."""
        rewards = inputs.data["rewards"]
        return self._call(self.outcome, inputs, rewards.shape[0], 1, rewards.device,
                          lambda call, result: check_outcome_result(
                              call, result, _n_logical(inputs.meta)), task_rewards=rewards)

    def align_and_estimate(self, batch: Mapping[str, Any], facts: BatchFacts, scores: Tensor,
                           meta: Optional[BatchMeta], data: Mapping[str, Any], kl_coef: float
                           ) -> tuple[AlignedBatch, TemporalResult]:
        """Steps 4-8: the batch moved to the next-token convention (masks, log-probs, KL and
        process rewards), the outcome ``scores`` placed at each row's last generated
        position, and the temporal estimator."""
        aligned = align_batch(batch, facts, self.config, kl_coef, self._turn_ids_needed_by())
        outcome_rewards = place_outcome(scores, aligned, self.config)
        temporal = self.estimate(temporal_inputs(aligned, outcome_rewards, self.config, meta, data))
        return aligned, temporal

    def estimate(self, inputs: TemporalInputs) -> TemporalResult:
        """Temporal estimation stage: advantages, returns and total rewards."""
        bs, width = inputs.loss_mask.shape
        return self._call(self.estimator, inputs, bs, width, inputs.loss_mask.device,
                          check_temporal_result)

    def shape_process(self, inputs: ProcessAdvantageInputs,
                      prm: Optional[PRMAdvantageShapingConfig] = None) -> Tensor:
        """Process advantage shaping stage (SPEC §3 step 10)."""
        stage = self.process
        builtin = resolve_process_mode(prm, self.config, stage)
        if builtin is not None:
            mode, kwargs = builtin
            return builtin_stage("process_adv_shaping", mode).fn(inputs, **kwargs)
        bs, width = inputs.advantages.shape
        return self._call(stage, inputs, bs, width, inputs.advantages.device, check_process_result)

    # ------------------------------------------------------------------ normalization

    def normalize_rewards(self, outcome: OutcomeResult, task_rewards: Tensor,
                          meta: Optional[BatchMeta]) -> Tensor:
        """Scaling, clipping and (rollout-aware) reward normalization (SPEC §3 step 3).

        ``task_rewards`` are the rewards before the length penalty: rows of one logical
        rollout must agree on them too when their references are derived.
        """
        entry = _entry(self.outcome)
        identity = entry is not None and entry.builtin and entry.auto  # the unchanged rewards
        return normalize_outcome_rewards(outcome, task_rewards, meta, self.config,
                                         identity_outcome=identity, stage=self.outcome.where)

    def normalize_advantages(self, advantages: Tensor, loss_mask: Tensor,
                             meta: Optional[BatchMeta]) -> Tensor:
        """Advantage normalization over active tokens (SPEC §3 step 9)."""
        norm = self.config.adv_norm
        if norm is None:
            return advantages
        check_group_members("actor.adv_norm", norm, meta, self.config.singleton_groups)
        with norm_errors("actor.adv_norm"):
            if meta is None:
                return normalize(advantages, norm, loss_mask)
            return normalize(advantages, norm, loss_mask, group_sizes=meta.traj_group_sizes,
                             member_counts=meta.logical_group_sizes)

    # ------------------------------------------------------------------ full replacement

    def compute_replacement(self, batch: Mapping[str, Any], meta: Optional[BatchMeta],
                            prm: Optional[PRMAdvantageShapingConfig], facts: BatchFacts,
                            kl_coef: float) -> dict[str, Any]:
        """Run the user's whole-computation function and merge its checked result."""
        inputs = AdvantageInputs(read_only(batch), self.config, meta, prm, kl_coef)
        mopd = batch.get("mopd_teacher_logp_sum") is not None
        result = self._call(self.compute, inputs, facts.batch_size, facts.width, facts.device,
                            lambda call, r: check_advantage_result(call, r, mopd),
                            task_rewards=batch["rewards"])
        out = dict(batch)
        out.update(advantages=result.advantages, returns=result.returns,
                   loss_mask=result.loss_mask, logprobs=result.logprobs, rewards=result.rewards,
                   tot_rewards=result.total_rewards, kl_rewards=result.kl_rewards)
        out.update(result.extras)
        return out

    # ------------------------------------------------------------------ helpers

    def _check_settings_against(self, batch: Mapping[str, Any], kl_coef: float) -> None:
        """Settings the batch makes meaningless: warned once per module (the same config
        meets the same kind of batch every step), or raised where configured."""
        kl_problem = reference_logp_problem(batch, self.config, kl_coef)
        if kl_problem is not None:
            if self.config.missing_ref_logp == "raise":
                raise ValueError(kl_problem)
            self._warn_once("missing_ref_logp", kl_problem, MissingRefLogpWarning)
        process_problem = unused_process_stage(batch, self.config)
        if process_problem is not None:
            self._warn_once("unused_process_stage", process_problem, IgnoredSettingWarning)

    def _warn_once(self, what: str, message: str, category: type[Warning]) -> None:
        # Keyed by what, not by the message: a trainer's KL controller changes the
        # coefficient (and so the message) every step.
        if what not in self._warned:
            self._warned.add(what)
            warn_caller(message, category)

    def _call(self, stage: Stage, inputs: Any, bs: int, width: int, device: torch.device,
              check: Callable[[StageContractCheck, Any], Any], task_rewards: Optional[Tensor] = None) -> Any:
        if stage.builtin:
            return stage(inputs)
        call = StageContractCheck(stage.where, inputs, task_rewards, bs, width, device)
        try:
            result = stage(inputs)
        except Exception as exc:
            # The user's own exception, unchanged, with the stage that raised it named.
            exc.add_note(f"raised by the user stage {stage.where} (actor.advantage.{stage.family})")
            raise
        call.check_inputs_untouched()
        return check(call, result)

    def _turn_ids_needed_by(self) -> Optional[str]:
        entry = _entry(self.estimator)
        if entry is not None and entry.builtin and "turn_ids" in entry.requires:
            spec = self.config.advantage.estimator
            if spec is None or spec.implementation == "auto":
                return f"actor.gae_timestep_unit='turn' (estimator {entry.name!r})"
            return f"estimator {entry.name!r}"
        return None

    def _output(self, batch: Mapping[str, Any], aligned: AlignedBatch, advantages: Tensor,
                temporal: TemporalResult, rewards: Tensor) -> dict[str, Any]:
        out = dict(batch)
        out.update(advantages=advantages, returns=temporal.returns, loss_mask=aligned.loss_mask,
                   logprobs=aligned.old_logp, rewards=rewards,
                   tot_rewards=temporal.total_rewards, kl_rewards=aligned.kl_rewards,
                   is_truncated=aligned.is_truncated, input_token_loss_mask=batch["loss_mask"])
        out.update(optional_outputs(aligned))
        return out


def _check_no_fixed_slices(config: ActorConfig) -> None:
    """Without meta, a group-level normalization slices rows by ``group_size``; dropping
    unscorable rows would shift every later row into another prompt's slice."""
    for name in ("reward_norm", "adv_norm"):
        norm = getattr(config, name)
        if norm is not None and norm.group_size > 1 and "group" in (norm.mean_level,
                                                                    norm.std_level):
            raise ValueError(f"actor.unscorable_rewards: 'exclude' leaves unscorable rows out, "
                             f"which would shift the fixed actor.{name}.group_size "
                             f"({norm.group_size}) slices of a batch without meta into other "
                             f"prompts' groups; pass meta (concat_batch or a BatchMeta with the "
                             f"prompt groups)")


def _entry(stage: Any) -> Optional[StageEntry]:
    """The registry entry of a resolved stage (None: a dotted path, or the per-call mode)."""
    if not isinstance(stage, Stage) or stage.fn is None:
        return None
    return STAGES[stage.family].get(stage.implementation)


def _device_of(batch: Any) -> Optional[torch.device]:
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    return ids.device if isinstance(ids, Tensor) else None


def _n_logical(meta: Optional[BatchMeta]) -> Optional[int]:
    if meta is None or meta.rollout_groups is None:
        return None
    return sum(meta.logical_group_sizes)
