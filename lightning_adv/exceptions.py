"""Every error and warning class of the package, in one place.

Errors are ``ValueError``/``TypeError`` subclasses with messages naming the key, stage or
function, what was expected and what was given. Warnings are ``UserWarning`` subclasses,
so ``warnings.filterwarnings("error", category=...)`` turns one kind into an error.
"""

from __future__ import annotations


class AdvantageContractError(ValueError):
    """A stage function returned something that breaks its contract, or changed its inputs."""


class PolicyLossContractError(ValueError):
    """A policy loss of the user's returned something that breaks its contract (shape,
    finiteness, a gradient, scalar diagnostics) or changed its inputs in place."""


class PeerRankFailed(RuntimeError):
    """Another data-parallel rank failed while computing advantages (its error says why)."""


class TurnIdError(ValueError):
    """Invalid turn ids. ``detail`` is the message without its prefix, so each boundary
    names its own stage and key (:func:`lightning_adv.ops.gae.turn_id_errors`) instead of
    passing a name down to the kernel."""

    def __init__(self, where: str, detail: str):
        super().__init__(f"{where}: {detail}")
        self.detail = detail


class GroupingError(ValueError):
    """Groups that do not fit the batch. ``field`` (``""`` or ``".group_size"``) and
    ``detail`` let the caller name its config key at its boundary
    (:func:`lightning_adv.advantage.normalization.norm_errors`)."""

    def __init__(self, field: str, detail: str):
        super().__init__(f"norm{field}: {detail}")
        self.field = field
        self.detail = detail


class TaskError(ValueError):
    """A task, reward or scorer function of the trainer returned something it cannot use.

    The message names the config key and function, the prompt and the sample.
    """


class NonFiniteTrainingError(ValueError):
    """A training step produced a NaN or Inf (the advantage module's output, or a term of
    the loss); the message names the step and the term. Raised before the optimizer step,
    so the weights and every checkpoint written so far are those of the last good step."""


class CheckpointMismatchError(ValueError):
    """The checkpoint's weights do not fit the network this trainer config builds."""


class IgnoredSettingWarning(UserWarning):
    """A setting that has no effect in this configuration (or on this batch) was given."""


class RecipeOverrideWarning(UserWarning):
    """A field set in the config overrides the value of the named recipe (``actor.recipe``)."""


class UnknownBatchKeyWarning(UserWarning):
    """A batch key the pipeline does not read looks like a misspelt key it would read."""


class LogProbRangeWarning(UserWarning):
    """``ref_logp`` or ``prox_logp`` hold values above 0 at positions the pipeline reads."""


class SingletonGroupWarning(UserWarning):
    """Every group of a group-level normalization has one member, so each member is
    normalized against itself (group-mean-centred rewards are all 0)."""


class DroppedOutcomeRewardWarning(UserWarning):
    """An outcome reward landed on an inactive position and never reaches GAE (SPEC §9)."""


class MissingRefLogpWarning(UserWarning):
    """``kl_ctl > 0`` but the batch has no ``ref_logp``: the KL is taken against log-prob 0."""


class PaddingDependentScaleWarning(UserWarning):
    """A loss is divided by the response width (the padded columns of the batch), so its
    scale changes with padding: verl's ``seq-mean-token-sum-norm`` default without a
    ``loss_scale_factor``, followed through verl's registry."""
