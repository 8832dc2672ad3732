"""Random multi-turn rollout batches: rows of a prompt, policy turns and the tool or
environment spans between them (loss mask 0), and the same episodes in the
response-major layout the peers take (verl's ``response_mask`` columns start at the
first generated token).

An episode is described by :class:`Episode`: its prompt length, the generated tokens of
each turn and the masked span after each turn but the last. :func:`build` lays a list of
prompt groups of episodes out as one right-padded batch (token-aligned like SPEC §1)
with per-position random extras in the next-token convention.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lightning_adv import BatchMeta


@dataclass
class Episode:
    prompt: int
    """prompt tokens (>= 1)"""
    turns: list[int]
    """generated tokens of each policy turn (each >= 1)"""
    spans: list[int]
    """masked tokens after each turn but the last (len(turns) - 1 entries, each >= 1)"""
    reward: float = 0.0
    turn_rewards: list[float] = field(default_factory=list)
    states: list[int] = field(default_factory=list)
    """anchor state id of each turn (GiGPO)"""

    @property
    def length(self) -> int:
        return self.prompt + sum(self.turns) + sum(self.spans)

    def generated_positions(self) -> list[list[int]]:
        """Token positions of each turn's generated tokens."""
        out, pos = [], self.prompt
        for k, n in enumerate(self.turns):
            out.append(list(range(pos, pos + n)))
            pos += n + (self.spans[k] if k < len(self.spans) else 0)
        return out


def random_episode(g: torch.Generator, max_turns: int = 3, max_turn_len: int = 3,
                   max_span: int = 3, max_prompt: int = 3) -> Episode:
    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (), generator=g))

    n_turns = draw(1, max_turns)
    return Episode(prompt=draw(1, max_prompt), turns=[draw(1, max_turn_len) for _ in range(n_turns)],
                   spans=[draw(1, max_span) for _ in range(n_turns - 1)],
                   reward=float(torch.randint(0, 3, (), generator=g)) / 2,
                   turn_rewards=[float(torch.randn((), generator=g)) for _ in range(n_turns)])


def build(groups: list[list[Episode]], g: torch.Generator, *, turn_rewards: bool = False,
          states: bool = False, extra_width: int = 0) -> tuple[dict, BatchMeta]:
    """The batch of ``groups`` (token-aligned masks, ``turn_ids``, log-probs; ``values``,
    ``ref_logp``, ``sum_pi_squared`` and ``rollout_is_weights`` next-token aligned and
    random everywhere, padding included). ``turn_rewards``: each turn's reward at its
    last generated token; ``states``: ``anchor_state_ids`` from ``Episode.states``."""
    episodes = [ep for group in groups for ep in group]
    width = max(ep.length for ep in episodes) + 1 + extra_width
    bs = len(episodes)
    attention = torch.zeros(bs, width, dtype=torch.bool)
    loss = torch.zeros(bs, width, dtype=torch.int32)
    turn_ids = torch.full((bs, width), -1, dtype=torch.long)
    per_turn = torch.zeros(bs, width)
    state_ids = torch.full((bs, width), -1, dtype=torch.long)
    for row, ep in enumerate(episodes):
        attention[row, :ep.length] = True
        for k, positions in enumerate(ep.generated_positions()):
            loss[row, positions] = 1
            turn_ids[row, positions] = k
            if turn_rewards:
                per_turn[row, positions[-1]] = ep.turn_rewards[k]
            if states:
                state_ids[row, positions] = ep.states[k]
    pi = torch.rand(bs, width, generator=g) * 0.9 + 0.05
    rest = (1 - pi) ** 2 * torch.rand(bs, width, generator=g)
    batch = {
        "input_ids": torch.randint(3, 50, (bs, width), generator=g),
        "attention_mask": attention, "loss_mask": loss, "turn_ids": turn_ids,
        "logprobs": torch.where(loss.bool(), pi.log(), torch.zeros(())),
        "rewards": torch.tensor([ep.reward for ep in episodes]),
        "values": torch.randn(bs, width, generator=g),
        "ref_logp": -torch.rand(bs, width, generator=g),
        # next-token convention: position t scores token t+1, whose probability is pi[t + 1]
        "sum_pi_squared": torch.roll(pi ** 2 + rest, -1, 1),
        "rollout_is_weights": torch.rand(bs, width, generator=g) * 1.5,
    }
    if turn_rewards:
        batch["turn_rewards"] = per_turn
    if states:
        batch["anchor_state_ids"] = state_ids
    sizes = [len(group) for group in groups]
    meta = BatchMeta(n_trajs=len(groups), traj_group_sizes=sizes,
                     rollout_groups=[None] * len(groups))
    return batch, meta


def response_major(batch: dict, key: str, aligned: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, response_mask)`` in verl's layout: column j is the row's j-th token from
    its first generated token on. ``aligned``: ``key`` is in the next-token convention
    (position t scores token t+1), else token-aligned."""
    loss = batch["loss_mask"].bool()
    bs, width = loss.shape
    first = loss.int().argmax(dim=1)
    x = batch[key].float() if key != "loss_mask" else loss.float()
    out = torch.zeros(bs, width)
    mask = torch.zeros(bs, width)
    for row in range(bs):
        last = int(loss[row].nonzero().max())
        for j, pos in enumerate(range(int(first[row]), last + 1)):
            out[row, j] = x[row, pos - 1] if aligned else x[row, pos]
            mask[row, j] = float(loss[row, pos])
    return out, mask


def from_response_major(x: torch.Tensor, batch: dict) -> torch.Tensor:
    """verl's response-major ``x`` back at the aligned positions of ``batch`` ([B, T])."""
    loss = batch["loss_mask"].bool()
    out = torch.zeros(loss.shape, dtype=x.dtype)
    first = loss.int().argmax(dim=1)
    for row in range(loss.shape[0]):
        last = int(loss[row].nonzero().max())
        for j, pos in enumerate(range(int(first[row]), last + 1)):
            out[row, pos - 1] = x[row, j]
    return out


#: Keys in the next-token convention (position t describes token t + 1).
NEXT_TOKEN_KEYS = ("values", "ref_logp", "prox_logp", "sum_pi_squared", "rollout_is_weights",
                   "entropies")
#: What a masked (tool or environment) token holds in each token-aligned key.
MASKED_FILL = {"loss_mask": 0, "attention_mask": True, "turn_ids": -1, "logprobs": 0.0,
               "anchor_state_ids": -1}


def insert_masked_span(batch: dict, row: int, position: int, length: int,
                       fill: float = 7.0) -> dict:
    """A new batch with ``length`` masked tokens inserted before token ``position`` of
    ``row`` (attended, loss mask 0, turn id -1; ``fill`` in every other per-position key,
    which the pipeline must ignore there) and ``length`` padding columns appended to every
    other row. Next-token keys get the new entries at ``position - 1`` on (the positions
    predicting the new tokens)."""
    out = {}
    for key, x in batch.items():
        if not isinstance(x, torch.Tensor) or x.ndim != 2:
            out[key] = x
            continue
        at = position - 1 if key in NEXT_TOKEN_KEYS else position
        value = MASKED_FILL.get(key, fill)
        pad_value = False if x.dtype == torch.bool else (-1 if key in ("turn_ids", "anchor_state_ids") else 0)
        grown = torch.full((x.shape[0], x.shape[1] + length), pad_value, dtype=x.dtype)
        grown[:, :x.shape[1]] = x
        span = torch.full((length,), value, dtype=x.dtype)
        grown[row] = torch.cat([x[row, :at], span, x[row, at:]])
        out[key] = grown
    return out


def moved_positions(width: int, position: int, length: int, aligned: bool = True) -> torch.Tensor:
    """Where each of ``width`` old positions of the changed row is after
    :func:`insert_masked_span` (aligned positions by default)."""
    at = position - 1 if aligned else position
    old = torch.arange(width)
    return torch.where(old < at, old, old + length)
