"""Worker of the DDP tests of ``PPOLoss`` and ``AdvantageMetrics`` (gloo, CPU processes).

Each rank takes an uneven share of one global batch (different row and token counts,
one row without active tokens), computes the loss of every aggregation mode through a
``DistributedDataParallel`` model and the metrics of its rows, and rank 0 saves what
came out. The tests compare it with a single process holding the global batch. Lives in
an importable module because ``torch.multiprocessing.spawn`` pickles the worker.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from lightning_adv import AdvantageMetrics, BatchMeta, PPOLoss
from lightning_adv.losses.ppo_loss import LOSS_AGG_MODES

GROUP_SIZES = [2, 1, 3, 1]
RANK_GROUPS = [slice(0, 1), slice(1, 4)]  # rank 0 one group (2 rows), rank 1 three (5 rows)
WIDTH, FEATURES = 6, 3


def global_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rows = sum(GROUP_SIZES)
    mask = (torch.rand(rows, WIDTH, generator=g) < 0.7).double()
    mask[3] = 0.0  # a row without active tokens (excluded from the seq-mean modes)
    advantages = torch.randn(rows, WIDTH, generator=g, dtype=torch.float64) * mask
    advantages[2] = 0.0  # group 1 (row 2) has no learning signal
    return {
        "features": torch.randn(rows, WIDTH, FEATURES, generator=g, dtype=torch.float64),
        # far below 0, so that old + the policy's shift stay log-probs (<= 0)
        "old_logprobs": -torch.rand(rows, WIDTH, generator=g, dtype=torch.float64) - 4.0,
        "ref_logprobs": -torch.rand(rows, WIDTH, generator=g, dtype=torch.float64),
        "old_values": torch.randn(rows, WIDTH, generator=g, dtype=torch.float64),
        "returns": torch.randn(rows, WIDTH, generator=g, dtype=torch.float64),
        "advantages": advantages, "loss_mask": mask,
        "tot_rewards": torch.randn(rows, WIDTH, generator=g, dtype=torch.float64),
        "kl_rewards": -torch.rand(rows, WIDTH, generator=g, dtype=torch.float64),
        "token_rewards": torch.rand(rows, WIDTH, generator=g, dtype=torch.float64),
        "input_token_loss_mask": (torch.rand(rows, WIDTH, generator=g) < 0.5).double(),
    }


class TinyPolicy(nn.Module):
    """Log-probs, values and entropy as smooth functions of two weight vectors."""

    def __init__(self):
        super().__init__()
        self.policy = nn.Parameter(torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64))
        self.value = nn.Parameter(torch.tensor([0.5, 0.1, -0.4], dtype=torch.float64))

    def forward(self, features: torch.Tensor, old_logprobs: torch.Tensor):
        shift = features @ self.policy
        return old_logprobs + shift, features @ self.value, nn.functional.softplus(shift)


def loss_kwargs(mode: str) -> dict:
    return dict(loss_agg_mode=mode, kl_coef=0.1, entropy_coef=0.01, value_coef=0.5,
                value_clip_eps=0.2, dual_clip=3.0,
                loss_scale_factor=8.0 if mode == "seq-mean-token-sum-norm" else None)


def loss_and_grads(model: nn.Module, data: dict, mode: str) -> tuple[torch.Tensor, list]:
    """One backward pass of the full loss; returns the loss and the weights' gradients."""
    model.zero_grad()
    logprobs, values, entropy = model(data["features"], data["old_logprobs"])
    out = PPOLoss(**loss_kwargs(mode))(
        logprobs, data["old_logprobs"], data["advantages"], data["loss_mask"],
        ref_logprobs=data["ref_logprobs"], values=values, old_values=data["old_values"],
        returns=data["returns"], entropy=entropy)
    out["loss"].backward()
    params = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    return out["loss"].detach(), [p.grad.clone() for p in params.parameters()]


def rows_of(rank: int) -> slice:
    starts = [0]
    for size in GROUP_SIZES:
        starts.append(starts[-1] + size)
    groups = RANK_GROUPS[rank]
    return slice(starts[groups.start], starts[groups.stop])


def advantage_out(data: dict) -> dict:
    keys = ("loss_mask", "advantages", "returns", "tot_rewards", "kl_rewards", "token_rewards",
            "input_token_loss_mask")
    return {k: data[k] for k in keys}


def worker(rank: int, world: int, init_file: str, out_path: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        batch = global_batch()
        mine = {k: v[rows_of(rank)] for k, v in batch.items()}
        model = nn.parallel.DistributedDataParallel(TinyPolicy())
        results = {"grads": {mode: loss_and_grads(model, mine, mode)[1] for mode in LOSS_AGG_MODES}}
        meta = BatchMeta(n_trajs=len(GROUP_SIZES[RANK_GROUPS[rank]]),
                         traj_group_sizes=GROUP_SIZES[RANK_GROUPS[rank]])
        metrics = AdvantageMetrics()
        results["forward"] = metrics(advantage_out(mine), meta)  # synced on step
        loss = PPOLoss(**loss_kwargs("token-mean"))
        logprobs, values, entropy = model(mine["features"], mine["old_logprobs"])
        metrics.update(loss=loss(logprobs.detach(), mine["old_logprobs"], mine["advantages"],
                                 mine["loss_mask"], ref_logprobs=mine["ref_logprobs"],
                                 values=values.detach(), old_values=mine["old_values"],
                                 returns=mine["returns"], entropy=entropy.detach()))
        results["compute"] = metrics.compute()
        if rank == 0:
            torch.save(results, out_path)
        dist.barrier()  # neither rank tears gloo down while its peer still talks
    finally:
        dist.destroy_process_group()
