"""Advantage modules of a user that go non-finite after a few good training steps (the
non-finite step tests of tests/cli/test_run_failures.py)."""

import torch

from lightning_adv import AdvantageModule

#: the training step (0-based) from which these modules go wrong
BAD_FROM = 2


class LateNaNAdvantageModule(AdvantageModule):
    """Its advantages are NaN from training step BAD_FROM on (a division by a zero std of
    its own)."""

    def __init__(self, config):
        super().__init__(config)
        self.calls = 0

    def forward(self, batch, meta=None, *, prm=None, kl_coef=None):
        out = super().forward(batch, meta, prm=prm, kl_coef=kl_coef)
        self.calls += 1
        if self.calls > BAD_FROM:
            out["advantages"] = out["advantages"] * float("nan")
        return out


class LateOverflowAdvantageModule(LateNaNAdvantageModule):
    """From training step BAD_FROM on, its returns are finite but absurdly large, so the
    squared error of the value loss overflows and the loss is not finite."""

    def forward(self, batch, meta=None, *, prm=None, kl_coef=None):
        out = AdvantageModule.forward(self, batch, meta, prm=prm, kl_coef=kl_coef)
        self.calls += 1
        if self.calls > BAD_FROM:
            out["returns"] = torch.full_like(out["returns"], 1e30)
        return out


def _rank() -> int:
    import torch.distributed as dist
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class RankOneNaNAdvantageModule(LateNaNAdvantageModule):
    """NaN advantages from training step BAD_FROM on, on rank 1 only (rank 0 is fine)."""

    def forward(self, batch, meta=None, *, prm=None, kl_coef=None):
        out = AdvantageModule.forward(self, batch, meta, prm=prm, kl_coef=kl_coef)
        self.calls += 1
        if self.calls > BAD_FROM and _rank() == 1:
            out["advantages"] = out["advantages"] * float("nan")
        return out


class RankOneOverflowAdvantageModule(LateNaNAdvantageModule):
    """Overflowing value targets from training step BAD_FROM on, on rank 1 only."""

    def forward(self, batch, meta=None, *, prm=None, kl_coef=None):
        out = AdvantageModule.forward(self, batch, meta, prm=prm, kl_coef=kl_coef)
        self.calls += 1
        if self.calls > BAD_FROM and _rank() == 1:
            out["returns"] = torch.full_like(out["returns"], 1e30)
        return out
