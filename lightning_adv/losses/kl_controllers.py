"""KL coefficient controllers: a fixed coefficient, or Ziegler et al.'s (2019) adaptive one.

Both are ``nn.Module``s whose current coefficient is a buffer, so a controller assigned
to a LightningModule (or to a :class:`~lightning_adv.PPOLoss` as its ``kl_coef``) rides
in its ``state_dict`` and therefore in every Lightning checkpoint; a resumed run
continues from the saved coefficient, not from the initial one.

The adaptive rule is the one TRL, OpenRLHF and verl ship::

    error = clip(current_kl / target - 1, -0.2, 0.2)
    value *= 1 + error * n_steps / horizon

Under DDP every rank must call ``update`` with the same (globally reduced) KL, e.g. the
synced mean of :class:`~lightning_adv.AdvantageMetrics`, so the coefficients stay equal.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor, nn

from lightning_adv._checks import check_choice, check_int, check_number, fail

#: bound of the proportional error, as in Ziegler et al. and every implementation of it
PROPORTIONAL_ERROR_CLIP = 0.2


class KLController(nn.Module):
    """Base class of KL controllers: the one owner of a KL coefficient, held in a float64
    buffer named ``kl_coef`` (so it is checkpointed with the module that holds the
    controller). Subclasses implement :meth:`update`; read the coefficient as ``value``.
    """

    def __init__(self, kl_coef: float):
        super().__init__()
        check_number("kl_coef", kl_coef, minimum=0.0)
        self.register_buffer("kl_coef", torch.tensor(float(kl_coef), dtype=torch.float64))

    @property
    def value(self) -> float:
        """The current KL coefficient."""
        return float(self.kl_coef)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Checkpoints written before the buffer was renamed hold it as "coef".
        if prefix + "coef" in state_dict and prefix + "kl_coef" not in state_dict:
            state_dict[prefix + "kl_coef"] = state_dict.pop(prefix + "coef")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def update(self, current_kl: Union[float, Tensor], n_steps: int = 1) -> float:
        """Adjust the coefficient after ``n_steps`` steps whose mean KL was ``current_kl``;
        returns the new value."""
        raise NotImplementedError

    @staticmethod
    def _check_update(current_kl: Union[float, Tensor], n_steps: int) -> float:
        if isinstance(current_kl, Tensor):
            if current_kl.numel() != 1:
                fail("current_kl", "a scalar", f"a tensor of shape {tuple(current_kl.shape)}")
            current_kl = float(current_kl)
        check_number("current_kl", current_kl)
        check_int("n_steps", n_steps)
        return float(current_kl)


class FixedKLController(KLController):
    """A constant coefficient; ``update`` checks its arguments and changes nothing."""

    def __init__(self, kl_coef: float):
        super().__init__(kl_coef)

    def update(self, current_kl: Union[float, Tensor], n_steps: int = 1) -> float:
        self._check_update(current_kl, n_steps)
        return self.value

    def extra_repr(self) -> str:
        return f"kl_coef={self.value!r}"


class AdaptiveKLController(KLController):
    """Ziegler et al. (2019): steer the measured KL towards ``target`` over ``horizon`` steps.

    Args:
        kl_coef: the coefficient before the first update (the trainer's ``actor.kl_ctl``).
        target: the KL per token (or per sequence, whichever you measure) to aim for.
        horizon: steps (samples, in TRL's and verl's usage) over which an error of 20% moves
            the coefficient by 20%.
        init_kl_coef: deprecated name of ``kl_coef`` (this class's before 0.2, and verl's),
            accepted with a DeprecationWarning.
    """

    def __init__(self, kl_coef: Optional[float] = None, target: Optional[float] = None,
                 horizon: Optional[float] = None, *, init_kl_coef: Optional[float] = None):
        if init_kl_coef is not None:
            if kl_coef is not None:
                raise TypeError("AdaptiveKLController: got both kl_coef and its deprecated "
                                "name init_kl_coef; give kl_coef only")
            warnings.warn("AdaptiveKLController(init_kl_coef=...) is deprecated; use kl_coef=",
                          DeprecationWarning, stacklevel=2)
            kl_coef = init_kl_coef
        # the defaults exist only so that init_kl_coef can stand in for kl_coef
        missing = [n for n, v in (("kl_coef", kl_coef), ("target", target),
                                  ("horizon", horizon)) if v is None]
        if missing:
            raise TypeError(f"AdaptiveKLController: missing required argument(s) "
                            f"{', '.join(missing)}")
        super().__init__(kl_coef)
        check_number("target", target, positive=True)
        check_number("horizon", horizon, positive=True)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: Union[float, Tensor], n_steps: int = 1) -> float:
        current_kl = self._check_update(current_kl, n_steps)
        error = min(max(current_kl / self.target - 1, -PROPORTIONAL_ERROR_CLIP),
                    PROPORTIONAL_ERROR_CLIP)
        self.kl_coef.mul_(1 + error * n_steps / self.horizon)
        return self.value

    def extra_repr(self) -> str:
        return f"value={self.value!r}, target={self.target!r}, horizon={self.horizon!r}"


@dataclass(frozen=True)
class KLControllerConfig:
    """Which controller drives the KL coefficient; its initial value comes from elsewhere
    (the trainer's ``actor.kl_ctl``)."""

    type: str = "fixed"
    """'fixed' (constant coefficient) or 'adaptive' (Ziegler et al. 2019)"""
    target: Optional[float] = None
    """adaptive only: the KL to aim for"""
    horizon: Optional[float] = None
    """adaptive only: steps over which a 20% error moves the coefficient by 20%"""

    def __post_init__(self) -> None:
        check_choice("kl_controller.type", self.type, ("fixed", "adaptive"))
        if self.type == "adaptive":
            for name in ("target", "horizon"):
                check_number(f"kl_controller.{name}", getattr(self, name), positive=True)
        else:
            for name in ("target", "horizon"):
                if getattr(self, name) is not None:
                    fail(f"kl_controller.{name}", "null with type 'fixed'", getattr(self, name))

    def build(self, kl_coef: float) -> KLController:
        """The controller, starting at ``kl_coef``."""
        if self.type == "adaptive":
            return AdaptiveKLController(kl_coef, self.target, self.horizon)
        return FixedKLController(kl_coef)
