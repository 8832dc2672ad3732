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
