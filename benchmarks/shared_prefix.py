"""The update's forward and backward over tree rows: every row read whole, each prompt
read once, and each shared prefix read once, side by side in one process on one thread.

Builds ``--prompts`` trees of rows: a prompt of ``--prompt`` tokens, then at each depth of
``--tree`` (``NxL``: every node branches into ``N`` segments of ``L`` tokens; the last
depth's segments are the rows' own tokens, each cut to a seeded length from ``L/2`` to
``L``), right-padded. On a tiny Hugging Face model made by ``make_tiny`` (``--hidden``
wide, ``--layers`` deep), it times ``HFPolicy.train_forward`` and the backward pass of
the summed log-probs and entropies:

- **whole rows**: no prompt groups (every row read whole, in one call);
- **each prompt once**: the rows' prompt groups, cut at the prompts only (the two calls
  of prompt sharing, ``SharedPrefixes.of(..., beyond_prompts=False)``);
- **each shared prefix once**: the rows' prompt groups, the trie of their tokens cut as
  the trainer cuts it (``SharedPrefixes.of``).

The sides alternate ``--repeats`` times after one untimed round; each reports the median
milliseconds and the ratio of whole rows (and of each prompt once) to it. Each model
call has a fixed cost (a few milliseconds of Python and small kernels for a model this
small, forward and backward), which a wider model makes a smaller share of the time::

    python benchmarks/shared_prefix.py --page

(``--page`` alone writes ``docs/benchmarks/shared-prefix.md``.)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import harness

if __name__ == "__main__":
    harness.set_thread_environment(1)
    harness.use_this_checkout()

import torch  # noqa: E402  (after the thread settings: OpenMP reads them when torch loads)

SIDES = ("whole rows", "each prompt once", "each shared prefix once")
DEFAULT_PAGE = harness.ROOT / "docs" / "benchmarks" / "shared-prefix.md"


def tree_spec(text: str) -> tuple[int, int]:
    try:
        branches, length = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NxL (branches x tokens), got {text!r}")
    if branches < 1 or length < 2:
        raise argparse.ArgumentTypeError(f"expected N >= 1 and L >= 2, got {text!r}")
    return branches, length


def tree_rows(prompts: int, prompt: int, tree: Sequence[tuple[int, int]], seed: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids ``[B, T]`` right-padded with 0, real-token mask, prompt lengths) of the trees."""
    gen = torch.Generator().manual_seed(seed)
    rows: list[torch.Tensor] = []

    def grow(prefix: torch.Tensor, depth: int) -> None:
        branches, length = tree[depth]
        for _ in range(branches):
            n = length if depth < len(tree) - 1 else int(
                torch.randint(length // 2, length + 1, (1,), generator=gen))
            row = torch.cat([prefix, torch.randint(3, 250, (n,), generator=gen)])
            if depth == len(tree) - 1:
                rows.append(row)
            else:
                grow(row, depth + 1)

    for _ in range(prompts):
        grow(torch.randint(3, 250, (prompt,), generator=gen), 0)
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
    real = torch.arange(width)[None] < torch.tensor([len(r) for r in rows])[:, None]
    return ids, real, torch.full((len(rows),), prompt)


def timed_update(policy: Any, ids: torch.Tensor, real: torch.Tensor, prompts: Any) -> float:
    """Seconds of one forward and backward pass of ``train_forward``."""
    policy.zero_grad(set_to_none=True)
    start = time.perf_counter()
    logprobs, _, ent = policy.train_forward(ids, real, 1.0, True, prompts)
    ((logprobs + 0.01 * ent) * real).sum().backward()
    return time.perf_counter() - start


def measure(policy: Any, ids: torch.Tensor, real: torch.Tensor, prompt_lengths: torch.Tensor,
            group: int, repeats: int) -> dict[str, list[float]]:
    """Milliseconds of each side, alternating, after one untimed round."""
    import contextlib
    from unittest import mock

    from lightning_adv.trainer.policies.base import PromptGroups
    from lightning_adv.trainer.policies.hf.prompt_sharing import SharedPrefixes

    prompts = PromptGroups(prompt_lengths, group)
    at_prompts = mock.patch("lightning_adv.trainer.policies.hf.policy._shared",
                            lambda ids, p, policy: SharedPrefixes.of(
                                ids, p.prompt_lengths, beyond_prompts=False))
    setups = {SIDES[0]: (None, contextlib.nullcontext), SIDES[1]: (prompts, lambda: at_prompts),
              SIDES[2]: (prompts, contextlib.nullcontext)}
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    for i in range(repeats + 1):
        for side in SIDES[::1 if i % 2 == 0 else -1]:
            groups, context = setups[side]
            with context():
                seconds = timed_update(policy, ids, real, groups)
            if i:
                times[side].append(1e3 * seconds)
    return times


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/shared_prefix.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=2, help="trees (prompt groups)")
    parser.add_argument("--prompt", type=int, default=48, help="prompt tokens")
    parser.add_argument("--tree", type=tree_spec, nargs="+", default=[(1, 32), (2, 16), (4, 30)],
                        help="NxL at each depth: N branches of L tokens (the last: the rows' own)")
    parser.add_argument("--hidden", type=int, default=256, help="the model's width")
    parser.add_argument("--layers", type=int, default=4, help="the model's decoder layers")
    parser.add_argument("--repeats", type=int, default=9, help="timed rounds of the sides")
    parser.add_argument("--page", type=Path, nargs="?", const=DEFAULT_PAGE,
                        help=f"also write the results as a markdown page (alone: "
                             f"{harness.shown_path(DEFAULT_PAGE)})")
    args = parser.parse_args(argv)
    if min(args.prompts, args.prompt, args.repeats, args.hidden, args.layers) < 1:
        parser.error("--prompts, --prompt, --repeats, --hidden and --layers must be at least 1")
    import warnings

    from lightning_adv.trainer import PolicyConfig
    from lightning_adv.trainer.policies.hf.make_tiny import make_tiny
    from lightning_adv.trainer.policies.hf.policy import build_hf_policy
    from lightning_adv.trainer.policies.hf.prompt_sharing import SharedPrefixes

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    ids, real, prompt_lengths = tree_rows(args.prompts, args.prompt, args.tree, seed=0)
    group = len(ids) // args.prompts
    with tempfile.TemporaryDirectory(prefix="shared_prefix_") as tmp:
        path = make_tiny(Path(tmp) / "model", hidden_size=args.hidden, layers=args.layers,
                         intermediate_size=4 * args.hidden, max_positions=max(512, ids.shape[1]))
        policy = build_hf_policy(PolicyConfig(pretrained=str(path), dtype="float32"), seed=0)
    times = measure(policy, ids, real, prompt_lengths, group, args.repeats)
    levels = SharedPrefixes.of(ids, prompt_lengths).levels
    read = int(sum(level.mask.sum() for level in levels))
    shared_part = args.prompt + sum(length for _, length in args.tree[:-1])
    own = float(real.sum(1).float().mean()) - shared_part
    header = harness.page_header("Each shared prefix read once, against whole rows", [
        f"Threads: {harness.thread_note([1])}; one process, the sides alternating",
        f"Model: `make_tiny` Qwen2, {args.hidden} wide, {args.layers} layers, float32",
        f"Rows: {args.prompts} tree(s) of {group} rows, {ids.shape[1]} columns: a "
        f"{args.prompt}-token prompt, then {' then '.join(f'{n}x{n_}' for n, n_ in args.tree)} "
        f"(branches x tokens): each row shares its first {shared_part} tokens with others, "
        f"{shared_part / own:.1f} times its own {own:.1f} on average",
        f"Tokens read: {int(real.numel())} padded positions as whole rows, {read} as shared "
        f"prefixes in {len(levels)} model calls",
        f"{args.repeats} timed round(s) after one untimed one"])
    medians = {side: statistics.median(values) for side, values in times.items()}
    rows = [[side, f"{medians[side]:.1f}", harness.format_ratio(medians[SIDES[0]] / medians[side]),
             harness.format_ratio(medians[SIDES[1]] / medians[side])] for side in SIDES]
    print(header)
    harness.write_page(args.page, header, [
        "Milliseconds of one forward and backward pass of the update (`train_forward`, then "
        "the backward of its summed log-probs and entropies), medians over the rounds; the "
        "ratios are the whole rows' time, and each prompt once's, ÷ the side's (above 1: "
        "the side is faster).\n",
        harness.table(["side", "ms", "whole rows ÷ side", "each prompt once ÷ side"], rows)])


if __name__ == "__main__":
    main(sys.argv[1:])
