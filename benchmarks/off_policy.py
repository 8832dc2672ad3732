"""The off-policy learning table: one task at several staleness levels, without and with
rollout correction, several seeds; writes docs/benchmarks/off-policy.md.

    python benchmarks/off_policy.py --page docs/benchmarks/off-policy.md

Every run is ``python -m lightning_adv fit --config configs/async_grpo.yaml --config
configs/offpolicy/<correction>.yaml`` (GRPO on the ``reverse`` task, rollouts sampled by a
bfloat16 copy of the policy, old log-probs recomputed by the trained policy) with
``--model.ppo.off_policy_steps=K`` and ``--seed_everything=S``, one at a time, logs in a
temporary directory. Each run trains ``--steps`` updates: it runs ``steps + K`` rollout
steps, the first K only filling the queue. The corrections are verl's presets:
``none`` (no correction), ``tis`` (decoupled_token_is), ``icepop``
(decoupled_token_icepop), ``seq_mask`` (decoupled_k3_rs).

The page gives, per staleness and correction: the task reward at the start (mean of the
first ``--window`` steps) and at the end (mean of the last ``--window``), the mean and
spread over seeds and each seed's end value, the mean mismatch KL (k3, between the trained
policy's recomputed log-probs and the sampler's) and the fraction of the policy gradient's
tokens the correction rejected or zeroed, and the mean wall time; the page header
(``harness.page_header``) gives the date, machine, versions, command and commit. Each run
is checked to have logged its correction's metric (a config that did not apply fails the
script, not the table).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import harness
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = harness.ROOT
BASE = "configs/async_grpo.yaml"
CORRECTIONS = {  # name: (label, the metric only that correction logs, its "removed" metric)
    "none": ("no correction", None, None),
    "tis": ("TIS (token, 2)", "offpolicy/ratio_frac_high", None),
    "icepop": ("IcePop (token, 0.5_5)", "offpolicy/is_masked_frac_high", "masked"),
    "seq_mask": ("sequence mask (seq_mean_k3 0.01)", "offpolicy/rejected_seq_frac",
                 "offpolicy/rejected_frac"),
}
REWARD, KL = "train/task_reward", "offpolicy/mismatch_kl_k3"


@dataclass
class RunResult:
    staleness: int
    correction: str
    seed: int
    rewards: list[float]
    mismatch_kl: float
    removed: float  # fraction of policy-gradient tokens rejected or weighted 0 (NaN: none)
    seconds: float


def scalars(events: EventAccumulator, tag: str) -> list[float]:
    if tag not in events.Tags()["scalars"]:
        return []
    return [e.value for e in sorted(events.Scalars(tag), key=lambda e: e.step)]


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def read_run(log_dir: Path, staleness: int, correction: str, seed: int,
             seconds: float) -> RunResult:
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    rewards = scalars(events, REWARD)
    if not rewards:
        raise SystemExit(f"{log_dir}: no '{REWARD}' scalars logged")
    _, marker, removed_tag = CORRECTIONS[correction]
    if marker is not None and not scalars(events, marker):
        raise SystemExit(f"{log_dir}: correction '{correction}' logged no '{marker}': the "
                         f"configs/offpolicy/{correction}.yaml settings did not apply")
    if removed_tag == "masked":  # IcePop: tokens whose weight is 0, high and low
        removed = mean([h + low for h, low in zip(scalars(events, "offpolicy/is_masked_frac_high"),
                                                  scalars(events, "offpolicy/is_masked_frac_low"))])
    else:
        removed = mean(scalars(events, removed_tag)) if removed_tag else float("nan")
    return RunResult(staleness, correction, seed, rewards, mean(scalars(events, KL)), removed,
                     seconds)


def run_one(staleness: int, correction: str, seed: int, steps: int, save_dir: Path,
            overrides: list[str]) -> RunResult:
    name = f"k{staleness}_{correction}_s{seed}"
    command = [sys.executable, "-m", "lightning_adv", "fit", "--config", BASE, "--config",
               f"configs/offpolicy/{correction}.yaml", f"--seed_everything={seed}",
               f"--model.ppo.off_policy_steps={staleness}",
               f"--trainer.limit_train_batches={steps + staleness}",
               f"--trainer.logger.init_args.save_dir={save_dir}",
               f"--trainer.logger.init_args.name={name}", "--trainer.callbacks=[]",
               "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
               f"--trainer.default_root_dir={save_dir}", *overrides]
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds = time.perf_counter() - start
    return read_run(save_dir / name / "version_0", staleness, correction, seed, seconds)


def cell(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def table(results: list[RunResult], window: int) -> str:
    groups: dict[tuple[int, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.staleness, r.correction), []).append(r)
    rows = []
    for (staleness, correction), runs in groups.items():
        ends = [mean(r.rewards[-window:]) for r in runs]
        removed = mean([r.removed for r in runs])
        rows.append([str(staleness), CORRECTIONS[correction][0],
                     cell([mean(r.rewards[:window]) for r in runs]), cell(ends),
                     ", ".join(f"{e:.3f}" for e in ends),
                     f"{mean([r.mismatch_kl for r in runs]):.2e}",
                     "-" if removed != removed else f"{removed:.2%}",
                     f"{mean([r.seconds for r in runs]):.0f} s"])
    return harness.table(
        ["staleness", "correction", f"start (first {window})",
         f"end (last {window}), mean ± sd over seeds", "end per seed", "mismatch KL k3",
         "tokens rejected or zeroed", "wall time per run"], rows)


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


ABOUT = (
    "GRPO on the `reverse` task (`configs/async_grpo.yaml`), rollouts sampled by a bfloat16 "
    "copy of the policy, trained after `staleness` more updates (`ppo.off_policy_steps`), "
    "old log-probs recomputed by the trained policy; the corrections are verl's presets in "
    "`configs/offpolicy/` (see the [off-policy guide](../guides/off-policy.md)). Rewards are "
    "the mean task reward of each step's fresh rollout (the current policy's samples). "
    "*Mismatch KL* is the mean k3 estimate of KL(rollout ‖ old) per token over the run; "
    "*rejected or zeroed* the fraction of the policy gradient's tokens the correction "
    "removed (IcePop: weight 0; sequence mask: rejected).")
DETERMINISTIC = (
    "The rewards are deterministic on one machine (every draw comes from generators seeded "
    "by the seed); the wall times are timings.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 4, 8])
    parser.add_argument("--corrections", nargs="+", default=list(CORRECTIONS),
                        choices=list(CORRECTIONS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300, help="updates per run")
    parser.add_argument("--window", type=int, default=10, help="steps averaged for start/end")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (each on one thread; "
                        "the rewards do not depend on it, the times do)")
    parser.add_argument("--page", type=Path, help="also write the results as a markdown page")
    parser.add_argument("--override", action="append", default=[],
                        help="extra CLI argument for every run (--override=--model.ppo.lr=0.001)")
    args = parser.parse_args()
    header = harness.page_header("Off-policy learning: staleness and rollout correction", [
        f"Runs: staleness {args.staleness} x corrections {args.corrections} x seeds "
        f"{args.seeds}, {args.steps} updates each, {args.jobs} at a time"])
    print(header, flush=True)
    before, results = load_average(), []
    cells = list(itertools.product(args.staleness, args.corrections, args.seeds))
    with tempfile.TemporaryDirectory(prefix="off_policy_") as tmp, \
            ThreadPoolExecutor(max(args.jobs, 1)) as pool:
        def one(cell: tuple[int, str, int]) -> RunResult:
            return run_one(*cell, args.steps, Path(tmp), args.override)

        for (staleness, correction, seed), result in zip(cells, pool.map(one, cells)):
            results.append(result)
            print(f"staleness {staleness}, {correction}, seed {seed}: end reward "
                  f"{mean(result.rewards[-args.window:]):.3f}", flush=True)
    notes = [f"Load average (1/5/15 min) before: {before}, after: {load_average()}."]
    if args.override:
        notes.append("Overrides: `" + " ".join(args.override) + "`.")
    harness.write_page(args.page, header, [ABOUT + "\n", table(results, args.window),
                                           "\n".join(notes) + "\n"],
                       deterministic=DETERMINISTIC)


if __name__ == "__main__":
    main()
