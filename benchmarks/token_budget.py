"""Learning at an equal generated-token budget: each config trains until its training
steps have sampled ``--budget`` tokens (``SampledTokenBudget``, counting
``train/sampled_tokens``: generated tokens, a tree's shared prefixes once, ``ppo.vine``'s
continuations included), at each of ``--seeds``, so samplers that spend tokens
differently (flat responses, trees, Monte Carlo continuations) are compared at one cost::

    python benchmarks/token_budget.py --configs grpo_reverse gtpo vine tree_grpo treerl \\
        --seeds 1 2 3 --budget 100000 --jobs 2 \\
        --page docs/benchmarks/learning-budget.md --plot docs/images/budget_curves.png

Each run is ``python -m lightning_adv fit --config configs/<name>.yaml
--seed_everything=S`` with the budget callback appended and ``--max-steps`` as the step
limit (a run that stops at the limit before the budget is reported as such). From each
run's TensorBoard events: the training steps the budget bought, the mean
``train/task_reward`` of the last ``--window`` of them, the held-out
``val/reward_greedy`` after training, and the mean generated and sampled tokens per
response (``train/response_length``, ``train/sampled_per_episode``: under ``ppo.tree``
the second is a tree's tokens per leaf).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import harness
import learning

ROOT = harness.ROOT
BUDGET_CALLBACK = "lightning_adv.trainer.run.callbacks.SampledTokenBudget"


@dataclass
class BudgetRun:
    """What one run's events say."""

    config: str
    seed: int
    seconds: float
    steps: list[int]
    rewards: list[float]
    totals: list[float]
    """train/sampled_tokens_total after each step"""
    generated_per_response: float
    sampled_per_response: float
    held_out: Optional[float]


def scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)}
            for tag in events.Tags()["scalars"]}


def train(config: str, seed: int, args: argparse.Namespace, runs_dir: Path) -> BudgetRun:
    # every step's total is read: logged every step whatever the config says
    overrides = [f"--trainer.limit_train_batches={args.max_steps}",
                 "--trainer.log_every_n_steps=1", f"--trainer.callbacks+={BUDGET_CALLBACK}",
                 f"--trainer.callbacks.max_tokens={args.budget}"]
    seconds, log_dir = learning.run_config(config, runs_dir / f"{config}_seed{seed}", overrides,
                                           None, seed)
    logged = scalars(log_dir)
    steps = sorted(logged["train/task_reward"])
    held_out = logged.get("val/reward_greedy", {})
    return BudgetRun(
        config, seed, seconds, steps, [logged["train/task_reward"][s] for s in steps],
        [logged["train/sampled_tokens_total"][s] for s in steps],
        statistics.fmean(logged["train/response_length"].values()),
        statistics.fmean(logged["train/sampled_per_episode"].values()),
        held_out[max(held_out)] if held_out else None)


def spread(values: Sequence[float], digits: int = 3) -> str:
    return (f"{statistics.median(values):.{digits}f} "
            f"[{min(values):.{digits}f}-{max(values):.{digits}f}]")


def config_row(config: str, runs: Sequence[BudgetRun], window: int, budget: int) -> list[str]:
    reached = [r for r in runs if r.totals[-1] >= budget]
    ends = [statistics.fmean(r.rewards[-window:]) for r in runs]
    held = [r.held_out for r in runs if r.held_out is not None]
    generated = statistics.fmean(r.generated_per_response for r in runs)
    sampled = statistics.fmean(r.sampled_per_response for r in runs)
    return [f"`{config}.yaml`", f"{len(reached)} of {len(runs)}",
            spread([len(r.steps) for r in runs], 0), spread(ends),
            spread(held) if held else "-", f"{generated:.2f}", f"{sampled:.2f}",
            f"{sampled / generated:.2f}", f"{statistics.fmean(r.seconds for r in runs):.0f}"]


def curve(config: str, runs: Sequence[BudgetRun], budget: int) -> Any:
    """The median over seeds of each run's reward at every thousand sampled tokens (the
    reward of the last step whose total is at most that many)."""
    curves = learning.reward_curve_module()
    grid = list(range(0, budget // 1000 + 1))
    medians = []
    for k in grid:
        values = []
        for run in runs:
            done = [i for i, total in enumerate(run.totals) if total <= 1000 * k]
            values.append(run.rewards[done[-1]] if done else run.rewards[0])
        medians.append(statistics.median(values))
    return curves.Run(config, grid, medians, [0.0] * len(grid))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+",
                        default=["grpo_reverse", "gtpo", "vine", "tree_grpo", "treerl"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--budget", type=int, default=100_000, help="sampled tokens per run")
    parser.add_argument("--max-steps", type=int, default=3000,
                        help="the step limit of every run (the budget should stop it first)")
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--page", type=Path)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    learning.check_configs(parser, args.configs)
    if args.budget < 1000 or args.jobs < 1 or args.window < 1:
        parser.error("--budget: at least 1000 tokens; --jobs, --window: at least 1")
    header = harness.page_header("Learning at an equal generated-token budget", [
        f"Budget: {args.budget} sampled tokens per run; seeds {' '.join(map(str, args.seeds))}; "
        f"{args.jobs} run(s) at a time, each on one thread (the CLI's torch_num_threads 1)"])
    print(header, flush=True)
    before = learning.load_average()
    jobs = [(c, s) for c in args.configs for s in args.seeds]
    with tempfile.TemporaryDirectory(prefix="budget_") as tmp, \
            ThreadPoolExecutor(args.jobs) as pool:
        done = list(pool.map(lambda job: train(*job, args, Path(tmp)), jobs))
    by_config = {c: [r for r in done if r.config == c] for c in args.configs}
    rows = [config_row(c, runs, args.window, args.budget) for c, runs in by_config.items()]
    table = harness.table(
        ["config", "runs that reached the budget", "training steps", "train reward, last "
         f"{args.window} steps", "held-out greedy reward after", "generated tokens per response",
         "sampled tokens per response", "sampled / generated", "seconds per run (mean)"], rows)
    if args.plot:
        learning.reward_curve_module().draw(
            [curve(c, runs, args.budget) for c, runs in by_config.items()], args.plot,
            args.window, x_label="thousands of sampled tokens",
            y_label="median over seeds of the step reward at each thousand tokens")
    about = (f"Each cell with seeds is the median over the seeds and, in brackets, the lowest "
             f"and highest. Generated and sampled tokens per response are means over every "
             f"step of every seed: a flat sampler samples each response's tokens (1.00), a tree "
             f"each shared prefix once (below 1), ppo.vine adds its continuations (above 1).")
    notes = [f"Load average (1/5/15 min) before: {before}; after: {learning.load_average()}."]
    sections = [about + "\n", table, "\n".join(notes) + "\n"]
    if args.plot and args.page:
        sections.append(f"![reward against sampled tokens]"
                        f"({os.path.relpath(args.plot, args.page.parent)})\n")
    harness.write_page(args.page, header, sections, deterministic=learning.DETERMINISTIC)


if __name__ == "__main__":
    main()
