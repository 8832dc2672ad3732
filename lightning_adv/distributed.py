"""Collectives of the advantage computation under torch.distributed, with failures agreed.

Batch-level statistics are sums over the data-parallel group (the default process group).
A rank that raises — bad input, a failing stage — must not leave the other ranks waiting
in a collective it will never join. So every collective here is preceded by a one-flag
agreement, a failing rank reports its failure once (:func:`report_failure`), and the
other ranks receive it at their next agreement and raise :class:`PeerRankFailed`.
Outside torch.distributed every function here is a no-op.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

from lightning_adv.exceptions import PeerRankFailed


#: inside :func:`contributing_nothing`: this rank's collectives carry neutral elements
_SILENT = contextvars.ContextVar("lightning_adv_contributing_nothing", default=False)


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _flag_device(device: Optional[torch.device]) -> torch.device:
    if device is not None:
        return device
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _max_flag(value: float, device: Optional[torch.device]) -> float:
    flag = torch.tensor([value], dtype=torch.float32, device=_flag_device(device))
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return float(flag.item())


def any_rank(flag: bool, device: Optional[torch.device] = None) -> bool:
    """Whether ``flag`` holds on any rank (one collective; ``flag`` itself outside
    torch.distributed), so every rank takes the same branch."""
    return _max_flag(float(flag), device) > 0 if distributed() else flag


def check_peers(device: Optional[torch.device]) -> None:
    """Raise :class:`PeerRankFailed` if another rank reported a failure."""
    if distributed() and _max_flag(0.0, device) > 0:
        raise PeerRankFailed(f"another data-parallel rank (this is rank {dist.get_rank()}) failed "
                             f"while computing advantages; its error names the cause")


def report_failure(device: Optional[torch.device]) -> None:
    """Called once by a rank that is about to raise, so its peers raise instead of waiting."""
    if distributed():
        _max_flag(1.0, device)


@contextlib.contextmanager
def contributing_nothing() -> Iterator[None]:
    """Within the block, this rank joins every collective of this module as a rank that
    holds no rows: its sums are zeros and its flags false. A rank whose rows are all
    unscorable runs the pipeline on a stand-in batch this way, so its peers' collectives
    are matched one for one (no hang) and their statistics are those of their rows only;
    what the stand-in computes is thrown away. Failures are still reported."""
    token = _SILENT.set(True)
    try:
        yield
    finally:
        _SILENT.reset(token)


def all_reduce_sum(values: Tensor) -> Tensor:
    """Sum ``values`` over the data-parallel group (a copy; identity in one process)."""
    if not distributed():
        return values
    check_peers(values.device)
    values = torch.zeros_like(values) if _SILENT.get() else values.clone()
    dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def any_across_ranks(flag: bool, device: Optional[torch.device]) -> bool:
    """True if ``flag`` is true on any rank, so every rank takes the same branch."""
    if not distributed():
        return flag
    check_peers(device)
    return _max_flag(1.0 if flag and not _SILENT.get() else 0.0, device) > 0
