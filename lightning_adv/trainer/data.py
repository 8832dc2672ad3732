"""The prompt dataset, a sampler that shards whole prompts across ranks, and step seeds.

A training step takes ``prompts_per_step`` prompts; each rank gets its own
``prompts_per_step / world_size`` of them and samples all ``n_samples`` responses of
each prompt itself, so a prompt group never spans ranks. The order of an epoch is a
permutation seeded by (training seed, epoch); a resumed run starts the interrupted
epoch at the batch where the checkpoint left it.
"""

from __future__ import annotations

import hashlib
from typing import Iterator, Optional

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler


def derive_seed(*parts: object) -> int:
    """A 63-bit seed mixed from ``parts`` (seed, step, rank, purpose...), stable across runs."""
    text = "/".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def generator(*parts: object, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` seeded by :func:`derive_seed` (never the global RNG)."""
    return torch.Generator(device=device).manual_seed(derive_seed(*parts))


class PromptDataset(Dataset):
    """Prompt indices ``0..num_prompts-1``; the task turns an index into its instance."""

    def __init__(self, num_prompts: int):
        self.num_prompts = num_prompts

    def __len__(self) -> int:
        return self.num_prompts

    def __getitem__(self, index: int) -> int:
        return index


class PromptSampler(DistributedSampler):
    """Shards each step's prompts across ranks; whole prompts only.

    Step ``i`` of an epoch uses prompts ``perm[i*P:(i+1)*P]`` of the epoch's permutation
    (``P = prompts_per_step``); rank ``r`` of ``W`` takes the ``r``-th slice of ``P/W`` of
    them. A ``DistributedSampler`` subclass, so Lightning keeps it under DDP.
    """

    def __init__(self, dataset: PromptDataset, prompts_per_step: int, num_replicas: int = 1,
                 rank: int = 0, seed: int = 0, shuffle: bool = True):
        if prompts_per_step % num_replicas:
            raise ValueError(f"ppo.prompts_per_step: {prompts_per_step} prompts cannot be split "
                             f"evenly over {num_replicas} ranks (prompt groups never span ranks)")
        if len(dataset) < prompts_per_step:
            raise ValueError(f"task.num_prompts: the pool ({len(dataset)}) is smaller than one "
                             f"step's prompts (ppo.prompts_per_step={prompts_per_step})")
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle,
                         seed=seed, drop_last=True)
        self.prompts_per_step = prompts_per_step
        self.per_rank = prompts_per_step // num_replicas
        self.steps_per_epoch = len(dataset) // prompts_per_step
        self.num_samples = self.steps_per_epoch * self.per_rank
        self.total_size = self.steps_per_epoch * prompts_per_step
        self._resume: Optional[tuple[int, int]] = None

    def resume_at(self, epoch: int, batches_done: int) -> None:
        """Skip the first ``batches_done`` steps the next time ``epoch`` is iterated."""
        self._resume = (epoch, batches_done)

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)
        if self.shuffle:
            order = torch.randperm(n, generator=generator(self.seed, "epoch", self.epoch)).tolist()
        else:
            order = list(range(n))
        skip = 0
        if self._resume is not None and self._resume[0] == self.epoch:
            skip = self._resume[1]
        self._resume = None
        p, k, r = self.prompts_per_step, self.per_rank, self.rank
        for step in range(skip, self.steps_per_epoch):
            yield from order[step * p + r * k: step * p + (r + 1) * k]

    def __len__(self) -> int:
        return self.num_samples


class PromptLoader(DataLoader):
    """Batches of prompt indices (one step's share of this rank) whose position in the epoch
    is saved in checkpoints (Lightning's ``state_dict``/``load_state_dict`` loader protocol).

    The position counts training steps *done* (``step_done``), not batches fetched: Lightning
    fetches one batch ahead, so the iterator's own count would skip a step on resume.
    """

    def __init__(self, dataset: PromptDataset, sampler: PromptSampler):
        super().__init__(dataset, batch_size=sampler.per_rank, sampler=sampler, drop_last=True)
        self._position = (0, 0)

    def step_done(self, epoch: int) -> None:
        """Record that one more step of ``epoch`` has been trained."""
        done_epoch, done = self._position
        self._position = (epoch, done + 1 if done_epoch == epoch else 1)

    def state_dict(self) -> dict[str, int]:
        epoch, done = self._position
        return {"epoch": epoch, "steps_done": done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._position = (int(state["epoch"]), int(state["steps_done"]))
        self.sampler.resume_at(*self._position)
