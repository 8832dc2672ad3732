"""Batch grouping metadata and per-prompt batch assembly (SPEC §1)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_adv._checks import is_int

ROLLOUT_GROUP_KEY = "rollout_group"
#: 2-D keys with one row per sample that are not token tensors (``rewards`` may be
#: ``[rows, K]``, one column per reward function): concatenated, never padded or trimmed.
ROW_KEYS = frozenset({"rewards"})
#: ``[rows, S, K]`` keys with one slot per step of a row (``mc_returns``, NaN where there is
#: no continuation): padded with NaN to the most steps and continuations, never trimmed.
STEP_KEYS = frozenset({"mc_returns"})


@dataclass(frozen=True)
class RolloutGroup:
    """The logical rollouts (episodes) of one prompt.

    Logical rollout ``i`` occupies ``row_counts[i]`` contiguous tensor rows (a multi-turn
    episode split into several rows, say). ``rewards[i]`` is an optional explicit reference
    reward for that rollout, used by rollout-aware reward normalization; an empty tuple
    means no explicit references.
    """

    row_counts: tuple[int, ...]
    rewards: tuple[Optional[float], ...] = ()

    def __post_init__(self) -> None:
        counts = tuple(self.row_counts) if isinstance(self.row_counts, Sequence) else None
        if not counts or not all(is_int(c, minimum=1) for c in counts):
            raise ValueError(f"RolloutGroup.row_counts: expected a non-empty sequence of "
                             f"positive integers, got {self.row_counts!r}")
        rewards = tuple(self.rewards) if isinstance(self.rewards, Sequence) else None
        if rewards is None:
            raise ValueError(f"RolloutGroup.rewards: expected a sequence, got {self.rewards!r}")
        if not rewards:
            rewards = (None,) * len(counts)
        if len(rewards) != len(counts):
            raise ValueError(f"RolloutGroup.rewards: expected one entry per logical rollout "
                             f"({len(counts)}), got {len(rewards)}")
        for i, r in enumerate(rewards):
            if r is None:
                continue
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r):
                raise ValueError(f"RolloutGroup.rewards[{i}]: expected a finite number or None, "
                                 f"got {r!r}")
        object.__setattr__(self, "row_counts", counts)
        object.__setattr__(self, "rewards", rewards)

    @property
    def n_rollouts(self) -> int:
        """The prompt's logical rollouts (episodes)."""
        return len(self.row_counts)

    @property
    def n_rows(self) -> int:
        """The tensor rows its logical rollouts occupy."""
        return sum(self.row_counts)

    def validate_rows(self, n_rows: int) -> None:
        """Check that the logical rollouts cover exactly ``n_rows`` tensor rows."""
        if self.n_rows != n_rows:
            raise ValueError(f"RolloutGroup.row_counts: logical rollouts cover {self.n_rows} rows "
                             f"({list(self.row_counts)}), but the prompt has {n_rows} rows")


@dataclass(frozen=True)
class BatchMeta:
    """How the rows of a batch group into prompts and logical rollouts."""

    n_trajs: int
    """number of prompts (trajectory groups)"""
    traj_group_sizes: list[int]
    """tensor rows of each prompt, in batch order; sums to the batch size"""
    traj_seqlens: Optional[list[int]] = None
    """padded width of each prompt before concatenation"""
    rollout_groups: Optional[list[Optional[RolloutGroup]]] = None
    """per prompt: its logical rollouts, or None when every row is its own rollout"""
    unscorable_members: Optional[list[int]] = None
    """per prompt: logical rollouts left out as unscorable (``actor.unscorable_rewards:
    exclude``). The module sets it on the meta of the rows it keeps, so a group stage can
    tell a group that exclusion shrank to one member (advantage 0: no scored peer to
    compare with) from a batch sampled with one response per prompt; None: none left out"""

    def __post_init__(self) -> None:
        if not isinstance(self.n_trajs, int) or isinstance(self.n_trajs, bool) or self.n_trajs < 0:
            raise ValueError(f"BatchMeta.n_trajs: expected a non-negative integer, got {self.n_trajs!r}")
        sizes = list(self.traj_group_sizes)
        if len(sizes) != self.n_trajs or not all(is_int(s, minimum=1) for s in sizes):
            raise ValueError(f"BatchMeta.traj_group_sizes: expected {self.n_trajs} positive integers, "
                             f"got {self.traj_group_sizes!r}")
        object.__setattr__(self, "traj_group_sizes", sizes)
        if self.traj_seqlens is not None:
            seqlens = list(self.traj_seqlens)
            if len(seqlens) != self.n_trajs:
                raise ValueError(f"BatchMeta.traj_seqlens: expected {self.n_trajs} entries, "
                                 f"got {len(seqlens)}")
            object.__setattr__(self, "traj_seqlens", seqlens)
        if self.rollout_groups is not None:
            groups = list(self.rollout_groups)
            if len(groups) != self.n_trajs:
                raise ValueError(f"BatchMeta.rollout_groups: expected one entry (or None) per "
                                 f"prompt ({self.n_trajs}), got {len(groups)}")
            for i, (group, rows) in enumerate(zip(groups, sizes)):
                checked_rollout_group(group, rows, f"BatchMeta.rollout_groups[{i}]")
            object.__setattr__(self, "rollout_groups", groups)
        if self.unscorable_members is not None:
            left_out = list(self.unscorable_members)
            if len(left_out) != self.n_trajs or not all(is_int(n, minimum=0) for n in left_out):
                raise ValueError(f"BatchMeta.unscorable_members: expected {self.n_trajs} "
                                 f"non-negative integers or None, got {self.unscorable_members!r}")
            object.__setattr__(self, "unscorable_members", left_out)

    @property
    def batch_size(self) -> int:
        """Rows of the batch this meta describes (the sum of ``traj_group_sizes``)."""
        return sum(self.traj_group_sizes)

    @property
    def logical_group_sizes(self) -> list[int]:
        """Logical rollouts per prompt (the member count of each group)."""
        groups = self.rollout_groups or [None] * self.n_trajs
        return [g.n_rollouts if g is not None else rows
                for g, rows in zip(groups, self.traj_group_sizes)]

    @property
    def shrunk_to_one(self) -> list[bool]:
        """Per prompt: exclusion of unscorable rollouts left it one member of several
        (:attr:`unscorable_members`); its group statistics compare it with nothing."""
        if self.unscorable_members is None:
            return [False] * self.n_trajs
        return [n == 1 and out > 0
                for n, out in zip(self.logical_group_sizes, self.unscorable_members)]

    @property
    def rollout_row_counts(self) -> list[int]:
        """Rows of every logical rollout in batch order (1 for ungrouped rows)."""
        groups = self.rollout_groups or [None] * self.n_trajs
        counts: list[int] = []
        for group, rows in zip(groups, self.traj_group_sizes):
            counts.extend(group.row_counts if group is not None else [1] * rows)
        return counts

    @property
    def explicit_reference_rewards(self) -> list[Optional[float]]:
        """The explicit reference reward of every logical rollout (None where not given)."""
        groups = self.rollout_groups or [None] * self.n_trajs
        refs: list[Optional[float]] = []
        for group, rows in zip(groups, self.traj_group_sizes):
            refs.extend(group.rewards if group is not None else [None] * rows)
        return refs

    def index(self, device: torch.device) -> "MetaIndex":
        """The grouping as index tensors on ``device`` (read-only), built once per
        grouping: a second call with unchanged ``traj_group_sizes`` and ``rollout_groups``
        returns the same tensors."""
        key = (tuple(self.traj_group_sizes),
               None if self.rollout_groups is None else tuple(self.rollout_groups))
        cached = self.__dict__.get("_index_cache")
        if cached is None or cached[0] != key:  # (identical groups compare by identity)
            cached = (key, {})
            object.__setattr__(self, "_index_cache", cached)
        index = cached[1].get(device)
        if index is None:
            index = cached[1][device] = MetaIndex.build(self, device)
        return index

    def __getstate__(self) -> dict:
        # The index cache is rebuilt where it is needed; never pickled or deep-copied.
        return {k: v for k, v in self.__dict__.items() if k != "_index_cache"}


@dataclass(frozen=True)
class MetaIndex:
    """Index tensors of one :class:`BatchMeta` on one device (:meth:`BatchMeta.index`).
    Shared between calls: never modify them."""

    traj_of_row: Tensor
    """[B] long: each row's prompt group"""
    rollout_of_row: Tensor
    """[B] long: each row's logical rollout"""
    rollout_starts: Tensor
    """[R] long: the first row of each logical rollout"""
    explicit_supplied: Tensor
    """[R] bool: the rollout carries an explicit reference reward"""
    explicit_rewards: Tensor
    """[R] float64: the explicit reference rewards (0 where none)"""
    any_explicit: bool
    one_row_each: bool
    """every logical rollout is one row (rollout index = row index)"""

    @staticmethod
    def build(meta: "BatchMeta", device: torch.device) -> "MetaIndex":
        sizes = torch.tensor(meta.traj_group_sizes, dtype=torch.long)
        counts = torch.tensor(meta.rollout_row_counts, dtype=torch.long)
        explicit = meta.explicit_reference_rewards
        supplied = torch.tensor([r is not None for r in explicit], dtype=torch.bool)
        values = torch.tensor([0.0 if r is None else r for r in explicit], dtype=torch.float64)
        return MetaIndex(
            traj_of_row=torch.repeat_interleave(torch.arange(len(sizes)), sizes).to(device),
            rollout_of_row=torch.repeat_interleave(torch.arange(len(counts)), counts).to(device),
            rollout_starts=(counts.cumsum(0) - counts).to(device),
            explicit_supplied=supplied.to(device), explicit_rewards=values.to(device),
            any_explicit=bool(supplied.any()), one_row_each=len(counts) == int(counts.sum()))


TrajBatchMeta = BatchMeta


def _pad_width(x: torch.Tensor, width: int) -> torch.Tensor:
    """Right-pad dimension 1 of ``x`` with zeros to ``width`` (a new tensor)."""
    if x.shape[1] == width:
        return x.clone()
    shape = list(x.shape)
    shape[1] = width
    out = x.new_zeros(shape)
    out[:, : x.shape[1]] = x
    return out


def _pad_steps(values: list[torch.Tensor]) -> list[torch.Tensor]:
    """``[rows, S, K]`` tensors padded with NaN (no continuation) to the most step slots
    and continuations among them (new tensors)."""
    slots = max(v.shape[1] for v in values)
    width = max(v.shape[2] for v in values)
    padded = []
    for v in values:
        out = v.new_full((v.shape[0], slots, width), float("nan"))
        out[:, : v.shape[1], : v.shape[2]] = v
        padded.append(out)
    return padded


def concat_batch(trajs: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], BatchMeta]:
    """Concatenate per-prompt dicts into one right-padded batch and its complete metadata.

    Each dict holds one prompt's rows (at that prompt's own width) and optionally a
    ``rollout_group`` entry. Tensors with two or more dimensions are right-padded with 0
    to the widest prompt and concatenated; 1-D tensors and lists are concatenated; any
    other value (None, say) is taken from the first prompt. The returned tensors are new:
    the caller's tensors are never aliased. ``meta.rollout_groups`` is always a list, so
    reward normalization of the result takes the rollout-aware path.
    """
    if isinstance(trajs, Mapping) or not isinstance(trajs, Sequence) or len(trajs) == 0:
        raise ValueError("concat_batch: expected a non-empty list of per-prompt dicts")
    keys = [k for k in trajs[0] if k != ROLLOUT_GROUP_KEY]
    shapes = [_prompt_shape(i, traj, keys) for i, traj in enumerate(trajs)]
    sizes = [rows for rows, _ in shapes]
    seqlens = [width for _, width in shapes]
    groups = [_prompt_group(i, traj, rows) for i, (traj, rows) in enumerate(zip(trajs, sizes))]
    width = max(seqlens)
    batch = {key: _concat_values(key, [traj[key] for traj in trajs], sizes, width)
             for key in keys}
    meta = BatchMeta(n_trajs=len(trajs), traj_group_sizes=sizes, traj_seqlens=seqlens,
                     rollout_groups=groups)
    return batch, meta


def _prompt_shape(i: int, traj: Any, keys: list[str]) -> tuple[int, int]:
    """Rows and width of prompt ``i``, which must carry the same keys as prompt 0."""
    if not isinstance(traj, Mapping):
        raise ValueError(f"concat_batch: prompt {i} is a {type(traj).__name__}, expected a dict")
    other = [k for k in traj if k != ROLLOUT_GROUP_KEY]
    if set(other) != set(keys):
        raise ValueError(f"concat_batch: prompt {i} has keys {sorted(other)}, but prompt 0 has "
                         f"{sorted(keys)}; every prompt must carry the same keys")
    mask = traj.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.ndim != 2:
        raise ValueError(f"concat_batch: prompt {i} needs a 2-D 'attention_mask' tensor "
                         f"[rows, width], got {type(mask).__name__}")
    rows, width = mask.shape
    return rows, width


def _prompt_group(i: int, traj: Mapping[str, Any], rows: int) -> Optional[RolloutGroup]:
    return checked_rollout_group(traj.get(ROLLOUT_GROUP_KEY), rows,
                                 f"concat_batch: prompt {i} 'rollout_group'")


def checked_rollout_group(group: Any, rows: int, where: str) -> Optional[RolloutGroup]:
    """``group`` when it is None or a ``RolloutGroup`` that fits a prompt of ``rows`` rows;
    otherwise a ``ValueError`` prefixed with ``where``."""
    if group is None:
        return None
    if not isinstance(group, RolloutGroup):
        raise ValueError(f"{where} must be a RolloutGroup or None, got {type(group).__name__}")
    try:
        group.validate_rows(rows)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return group


def _concat_values(key: str, values: list[Any], sizes: list[int], width: int) -> Any:
    """One key over all prompts: tensors padded and concatenated, lists joined, other
    values taken from the first prompt."""
    first = values[0]
    if isinstance(first, list):
        return [item for v in values for item in v]
    if not isinstance(first, torch.Tensor):
        return first
    for i, v in enumerate(values):
        if not isinstance(v, torch.Tensor) or v.ndim != first.ndim:
            raise ValueError(f"concat_batch: '{key}' of prompt {i} is not a tensor of the "
                             f"same rank as prompt 0's")
        if first.ndim >= 1 and v.shape[0] != sizes[i]:
            raise ValueError(f"concat_batch: '{key}' of prompt {i} has {v.shape[0]} "
                             f"rows, but its attention_mask has {sizes[i]}")
    if first.ndim == 0:
        return first.clone()
    if key in STEP_KEYS and first.ndim == 3 and first.is_floating_point():
        return torch.cat(_pad_steps(values), dim=0)
    if first.ndim >= 2 and key not in ROW_KEYS:
        # A tensor wider than the prompts keeps its extra width, so the module can
        # report the shape mismatch instead of silently losing columns.
        key_width = max([width] + [v.shape[1] for v in values])
        values = [_pad_width(v, key_width) for v in values]
    return torch.cat(values, dim=0)


def split_batch(batch: Mapping[str, Any], meta: BatchMeta) -> list[dict[str, Any]]:
    """Invert :func:`concat_batch`: one dict per prompt, trimmed back to its own width."""
    offsets = [0]
    for size in meta.traj_group_sizes:
        offsets.append(offsets[-1] + size)
    n_rows = offsets[-1]
    seqlens = meta.traj_seqlens
    out: list[dict[str, Any]] = []
    for i in range(meta.n_trajs):
        lo, hi = offsets[i], offsets[i + 1]
        traj: dict[str, Any] = {}
        for key, value in batch.items():
            if isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] == n_rows:
                part = value[lo:hi]
                if value.ndim >= 2 and seqlens is not None and key not in ROW_KEYS | STEP_KEYS:
                    part = part[:, : seqlens[i]]
                traj[key] = part.clone()
            elif isinstance(value, list) and len(value) == n_rows:
                traj[key] = value[lo:hi]
            else:
                traj[key] = value
        if meta.rollout_groups is not None and meta.rollout_groups[i] is not None:
            traj[ROLLOUT_GROUP_KEY] = meta.rollout_groups[i]
        out.append(traj)
    return out
