"""Learning results of the shipped configs as a range over seeds: the page
docs/benchmarks/learning.md and its reward-curve picture.

    python scripts/learning_table.py --configs ppo turn_gae grpo dr_grpo gvpo_prm grpo_dynamic \
        --seeds 1 2 3 --out docs/benchmarks/learning.md --plot docs/benchmarks/learning_curves.png

For every config and seed, one at a time and on one thread, runs

    python -m lightning_adv fit --config configs/<name>.yaml --seed_everything=<seed>

with its logs in a temporary directory (the Hugging Face configs, ``hf_*``, train the
tiny model ``python -m lightning_adv make-tiny`` writes there first), then reads each
run's TensorBoard events: ``train/task_reward`` at the start (mean of the first
``--window`` steps) and at the end (mean of the last ``--window``), and the last
``val/reward_greedy``. The page gives each as the median and the min-max over the
seeds, with the date, the machine, the versions, the command, and what is deterministic.
``--override`` adds flags to every run (``--override=--trainer.limit_train_batches=20``
for a quick check of the script itself).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from reward_curve import Run, draw, load  # noqa: E402

DETERMINISM = (
    "**What is deterministic.** Each run is reproducible on the machine that made it, with "
    "the same library versions: the same command and seed give the same numbers at every "
    "step (every random draw comes from generators seeded by the seed, the step and the "
    "rank, and the runs use one CPU thread). Another machine, or other versions of torch "
    "and its math libraries, need not give the same numbers: another CPU's vector units "
    "(AVX2, AVX-512, NEON) and the kernels torch chooses for them round floating-point "
    "sums differently, a sampled token eventually differs, and from there the run takes "
    "its own path. What carries over is the range over seeds in the table, not one run's digits; "
    "compare your runs with the range.")


@dataclass
class SeedRun:
    """One config at one seed: its reward curve, its last validation and its wall time."""

    seed: int
    run: Run
    val_greedy: float | None
    seconds: float


def last_scalar(log_dir: Path, tag: str) -> float | None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    if tag not in events.Tags()["scalars"]:
        return None
    return max(events.Scalars(tag), key=lambda e: (e.step, e.wall_time)).value


def run_once(name: str, seed: int, work: Path, overrides: list[str], tiny: Path | None) -> SeedRun:
    save_dir = work / f"seed{seed}"
    command = [sys.executable, "-m", "lightning_adv", "fit", "--config", f"configs/{name}.yaml",
               f"--seed_everything={seed}", f"--trainer.logger.init_args.save_dir={save_dir}",
               "--trainer.enable_progress_bar=false", "--torch_num_threads=1"]
    if tiny is not None:
        command.append(f"--model.policy.pretrained={tiny}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    subprocess.run([*command, *overrides], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    log_dir = save_dir / name / "version_0"
    return SeedRun(seed, load(log_dir, f"{name}.yaml"), last_scalar(log_dir, "val/reward_greedy"),
                   seconds)


def spread(values: list[float]) -> str:
    """``median [min-max]`` of ``values``."""
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def median_curve(name: str, runs: list[SeedRun]) -> Run:
    """The per-step median reward over the seeds (the steps all runs logged)."""
    steps = sorted(set.intersection(*(set(r.run.steps) for r in runs)))
    by_step = [{s: v for s, v in zip(r.run.steps, r.run.rewards)} for r in runs]
    rewards = [statistics.median(values[s] for values in by_step) for s in steps]
    return Run(f"{name}.yaml (median of {len(runs)} seeds)", steps, rewards, [0.0] * len(steps))


def page(results: dict[str, list[SeedRun]], seeds: list[int], window: int, overrides: list[str],
         plot: Path | None, out: Path | None) -> str:
    rows = []
    for name, runs in results.items():
        val = [r.val_greedy for r in runs if r.val_greedy is not None]
        rows.append([f"`{name}.yaml`", spread([r.run.start(window) for r in runs]),
                     spread([r.run.end(window) for r in runs]),
                     spread(val) if val else "-", str(len(runs[0].run.steps)),
                     f"{statistics.median(r.seconds for r in runs):.0f} s"])
    details = [f"Seeds: {', '.join(map(str, seeds))}, one run at a time, one CPU thread; "
               f"start and end are the mean `train/task_reward` of the first and last "
               f"{window} training steps; validation is the last `val/reward_greedy`"]
    if overrides:
        details.append("Overrides of every run: `" + " ".join(overrides) + "`")
    text = harness.page_header("Learning results over seeds", details) + "\n"
    text += ("Each cell is the median over the seeds and, in brackets, the lowest and the "
             "highest. Each run is the command `python -m lightning_adv fit --config "
             "configs/<name>.yaml --seed_everything=<seed>`.\n\n")
    text += harness.table(["config", "start reward", "end reward", "final validation (greedy)",
                           "steps", "wall time (median)"], rows) + "\n"
    if plot is not None:
        where = os.path.relpath(plot, out.parent) if out is not None else str(plot)
        text += f"![median reward per training step over the seeds]({where})\n\n"
    return text + DETERMINISM + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=["ppo", "turn_gae"],
                        help="names under configs/ (default: ppo turn_gae)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--out", type=Path, help="markdown page to write (also printed)")
    parser.add_argument("--plot", type=Path, help="PNG of the median reward curves")
    parser.add_argument("--window", type=int, default=10, help="steps averaged for start/end")
    parser.add_argument("--override", action="append", default=[],
                        help="extra CLI argument for every run (--override=--model.ppo.lr=0.001)")
    args = parser.parse_args()
    results: dict[str, list[SeedRun]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tiny = None
        if any(name.startswith("hf_") for name in args.configs):
            tiny = harness.make_tiny_model(ROOT, work / "tiny_lm")
        for name in args.configs:
            results[name] = []
            for seed in args.seeds:
                done = run_once(name, seed, work / name, args.override,
                                tiny if name.startswith("hf_") else None)
                print(f"{name} seed {seed}: start {done.run.start(args.window):.3f}, end "
                      f"{done.run.end(args.window):.3f} ({done.seconds:.0f} s)", flush=True)
                results[name].append(done)
    if args.plot is not None:
        draw([median_curve(name, runs) for name, runs in results.items()], args.plot, args.window)
    text = page(results, args.seeds, args.window, args.override, args.plot, args.out)
    print(text, end="")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
