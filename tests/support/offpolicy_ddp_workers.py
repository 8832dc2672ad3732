"""Worker of the DDP test of ``OffPolicyMetrics`` (gloo, CPU processes): each rank updates
with an uneven share of one global batch and rank 0 saves the synced values. Lives in an
importable module because ``torch.multiprocessing.spawn`` pickles the worker."""

from __future__ import annotations

import torch
import torch.distributed as dist

from lightning_adv import OffPolicyMetrics

CORRECTION = {"rollout_is": "token", "rollout_is_threshold": "0.6_1.5",
              "rollout_rs": "seq_mean_k3,token_k2", "rollout_rs_threshold": "0.02,0.05"}
RANK_ROWS = [slice(0, 3), slice(3, 10)]


def global_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    rows, width = 10, 8
    mask = (torch.rand(rows, width, generator=g) < 0.7).double()
    mask[4] = 0
    old = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 2 - 0.01
    rollout = (old + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.3).clamp(max=0)
    staleness = torch.arange(rows, dtype=torch.float64) % 3
    return old, rollout, mask, staleness


def worker(rank: int, world: int, init_file: str, out_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        old, rollout, mask, staleness = global_batch()
        rows = RANK_ROWS[rank]
        metrics = OffPolicyMetrics(dist_sync_on_step=False)
        metrics.update(old[rows], rollout[rows], mask[rows], CORRECTION, staleness[rows])
        values = metrics.compute()
        if rank == 0:
            torch.save(values, out_file)
    finally:
        dist.destroy_process_group()
