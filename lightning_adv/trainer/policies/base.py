"""What the trainer asks of a policy: :class:`Policy`."""

from __future__ import annotations

import torch
from torch import Tensor


def finite_or_raise(x: Tensor, what: str) -> Tensor:
    # -1e9 logits of banned tokens give finite log-probs; NaN or inf means divergence.
    if not bool(torch.isfinite(x).all()):
        raise FloatingPointError(f"{what}: the policy produced non-finite values (diverged "
                                 f"training? lower ppo.lr or raise ppo.max_grad_norm clipping)")
    return x
