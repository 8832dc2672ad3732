"""Does it learn? The shipped configs trained as a user runs them, and the first command
of the README timed end to end.

For each config, runs ``python -m lightning_adv fit --config configs/<name>.yaml`` exactly
as the README's first command does (one at a time, each in a fresh process, logs under a
temporary directory) and times the whole command, start-up included. The Hugging Face
configs (``hf_*``) train the tiny model that ``python -m lightning_adv make-tiny`` writes,
made once first. Then it reads each run's ``train/task_reward`` from its TensorBoard
events (``scripts/reward_curve.py``) into a table: the reward at step 0, the mean of the
first and last ``--window`` steps, the steps and the training wall time::

    python benchmarks/learning.py --configs ppo turn_gae grpo dr_grpo gvpo_prm grpo_dynamic \\
        --page docs/benchmarks/learning.md --plot docs/images/reward_curves.png
    python benchmarks/learning.py --configs hf_grpo hf_ppo \\
        --page docs/benchmarks/learning-hf.md --plot docs/images/hf_reward_curves.png
    python benchmarks/learning.py --configs ppo --install --page docs/benchmarks/first-command.md
    python benchmarks/learning.py --configs ppo grpo --tiny-hf --page docs/benchmarks/policy-choice.md

``--seeds 1 2 3`` runs each config once per seed (``--seed_everything=S``) and gives each
reward as the median and the min-max over the seeds (and the last ``val/reward_greedy``
likewise), with the median reward curve per config: a result another machine can compare
with, which one run's last digits are not (see the note on determinism)::

    python benchmarks/learning.py --configs ppo turn_gae grpo dr_grpo gvpo_prm grpo_dynamic \\
        --seeds 1 2 3 --page docs/benchmarks/learning-seeds.md --plot docs/images/seed_curves.png

``--install`` first times the README's install step alone (a fresh virtual environment
and ``pip install -c constraints.txt -e .``), once with pip's cache warm and once with
``--no-cache-dir``, as on a new user's machine. The runs use the CLI's own thread
settings (``torch_num_threads: 1``), like the README's command.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import harness

ROOT = harness.ROOT
DETERMINISTIC = (
    "The rewards are deterministic on one machine: every random draw of a run comes from "
    "generators seeded by the config's seed, so the same config, seed, machine and library "
    "versions give the same curve, step for step. Another CPU (other vector instructions) "
    "or other torch versions round differently, and a few hundred steps of these small "
    "policies amplify that: a run follows the same curve until one sampled token falls on "
    "the other side of a probability boundary, then takes its own course, ending within "
    "the spread over seeds rather than at the same number. The wall times and the install "
    "times are timings.")


def reward_curve_module() -> Any:
    """``scripts/reward_curve.py``, the reader and plotter of the trainer's reward logs."""
    path = ROOT / "scripts" / "reward_curve.py"
    spec = importlib.util.spec_from_file_location("reward_curve", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def timed(command: Sequence[str], **kwargs: Any) -> float:
    start = time.perf_counter()
    subprocess.run(list(command), check=True, **kwargs)
    return time.perf_counter() - start


def time_install(workdir: Path, use_cache: bool) -> float:
    """The README's install step in a fresh virtual environment, in seconds."""
    venv = workdir / ("venv" if use_cache else "venv-no-cache")
    python = venv / "bin" / "python"
    cache = [] if use_cache else ["--no-cache-dir"]
    return timed([sys.executable, "-m", "venv", str(venv)]) + timed(
        [str(python), "-m", "pip", "install", "-q", *cache, "-c", "constraints.txt", "-e", "."],
        cwd=ROOT)


def run_config(name: str, save_dir: Path, overrides: Sequence[str],
               model: Optional[Path], seed: Optional[int] = None) -> tuple[float, Path]:
    """Train ``configs/<name>.yaml`` (at ``seed``: ``--seed_everything``); the whole
    command's seconds and the run's log dir."""
    if model is not None:
        overrides = [f"--model.policy.pretrained={model}", *overrides]
    if seed is not None:
        overrides = [f"--seed_everything={seed}", *overrides]
    seconds = timed([sys.executable, "-m", "lightning_adv", "fit", "--config",
                     f"configs/{name}.yaml", f"--trainer.logger.init_args.save_dir={save_dir}",
                     "--trainer.enable_progress_bar=false", *overrides],
                    cwd=ROOT, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return seconds, save_dir / name / "version_0"


def last_scalar(log_dir: Path, tag: str) -> Optional[float]:
    """The value of ``tag`` at its last step in the run's TensorBoard events (None if absent)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    if tag not in events.Tags()["scalars"]:
        return None
    return max(events.Scalars(tag), key=lambda e: (e.step, e.wall_time)).value


def spread(values: Sequence[float]) -> str:
    """``median [min-max]`` of ``values``."""
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def seed_table(results: dict[str, list[tuple[Any, Optional[float]]]], window: int) -> str:
    """One row per config: start, end and final greedy validation over its seeds' runs
    (``(curve, last val/reward_greedy)`` each)."""
    rows = []
    for name, runs in results.items():
        val = [v for _, v in runs if v is not None]
        rows.append([name, spread([r.start(window) for r, _ in runs]),
                     spread([r.end(window) for r, _ in runs]), spread(val) if val else "-",
                     str(len(runs[0][0].steps))])
    return harness.table(["config", f"start (mean of first {window})",
                          f"end (mean of last {window})", "final val/reward_greedy", "steps"],
                         rows)


def median_curve(curves: Any, name: str, runs: Sequence[Any]) -> Any:
    """The per-step median reward over the seeds' curves (the steps every run logged)."""
    steps = sorted(set.intersection(*(set(r.steps) for r in runs)))
    by_step = [dict(zip(r.steps, r.rewards)) for r in runs]
    rewards = [statistics.median(values[s] for values in by_step) for s in steps]
    return curves.Run(f"{name} (median of {len(runs)} seeds)", steps, rewards,
                      [0.0] * len(steps))


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def train_configs(args: argparse.Namespace, runs_dir: Path, model: Optional[Path], curves: Any
                  ) -> tuple[list[Any], list[str], dict[str, list[tuple[Any, Optional[float]]]]]:
    """Each config once (or once per ``--seeds`` seed), one at a time: the reward curves, the
    commands' times, and per config its ``(curve, last val/reward_greedy)`` per seed."""
    runs, commands = [], []
    by_seed: dict[str, list[tuple[Any, Optional[float]]]] = {}
    variants = [(name, model if name.startswith("hf_") else None, f"{name}.yaml")
                for name in args.configs]
    if args.tiny_hf:  # the same config with the make-tiny model as its policy, beside it
        variants += [(name, model, f"{name}.yaml, tiny HF policy")
                     for name in args.configs if not name.startswith("hf_")]
    for i, (name, policy, label) in enumerate(variants):
        for seed in args.seeds or [None]:
            where = runs_dir / f"{i}" / ("config_seed" if seed is None else f"seed{seed}")
            seconds, log_dir = run_config(name, where, args.override, policy, seed)
            at = "" if seed is None else f" --seed_everything={seed}"
            pretrained = "" if policy is None or name.startswith("hf_") else \
                " --model.policy.pretrained=<tiny model>"
            commands.append(f"`fit --config configs/{name}.yaml{at}{pretrained}`: {seconds:.0f} s")
            runs.append(curves.load(log_dir, label))
            by_seed.setdefault(label, []).append((runs[-1], last_scalar(log_dir, "val/reward_greedy")))
    return runs, commands, by_seed


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=["ppo", "turn_gae"],
                        help="names under configs/ (default: ppo turn_gae)")
    parser.add_argument("--install", action="store_true", help="also time the install step")
    parser.add_argument("--window", type=int, default=10,
                        help="steps averaged for the start and end rewards")
    parser.add_argument("--override", action="append", default=[],
                        help="extra CLI argument for every run (--override=--model.ppo.lr=0.001)")
    parser.add_argument("--seeds", nargs="+", type=int,
                        help="run each config at each of these seeds; rewards as median "
                             "[min-max] over them (default: once, at the config's seed)")
    parser.add_argument("--tiny-hf", action="store_true",
                        help="also train each built-in-policy config with the make-tiny Hugging "
                             "Face model as its policy (the built-in policy's measured "
                             "alternative: docs/benchmarks/policy-choice.md)")
    parser.add_argument("--plot", type=Path, help="PNG of the reward curves")
    parser.add_argument("--page", type=Path, help="also write the results as a markdown page")
    return parser


def check_configs(parser: argparse.ArgumentParser, names: Sequence[str]) -> None:
    """A usage error naming every ``--configs`` name without its ``configs/<name>.yaml``."""
    unknown = [n for n in names if not (ROOT / "configs" / f"{n}.yaml").is_file()]
    if unknown:
        parser.error(f"--configs: no configs/<name>.yaml for {' '.join(unknown)}")


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_configs(parser, args.configs)
    if args.window < 1:
        parser.error(f"--window: expected at least 1, got {args.window}")
    curves = reward_curve_module()
    before = load_average()
    header = harness.page_header("Learning: the shipped configs as a user runs them", [
        "Threads: the CLI's default (torch_num_threads 1); OMP_WAIT_POLICY="
        f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}",
        f"lightning_adv from {harness.shown_path(ROOT / 'lightning_adv')}"])
    print(header, flush=True)
    notes = [f"Load average (1/5/15 min) before: {before}."]
    with tempfile.TemporaryDirectory(prefix="learning_") as tmp:
        tmp_path = Path(tmp)
        if args.install:
            warm, cold = time_install(tmp_path, True), time_install(tmp_path, False)
            notes.append(f"Install (`python3 -m venv` + `pip install -c constraints.txt -e .`): "
                         f"{warm:.0f} s with pip's cache warm, {cold:.0f} s with "
                         f"`--no-cache-dir`.")
        model = None
        if args.tiny_hf or any(n.startswith("hf_") for n in args.configs):
            model = harness.make_tiny_model(ROOT, tmp_path / "tiny_lm")
        runs, commands, by_seed = train_configs(args, tmp_path / "runs", model, curves)
        if args.seeds:
            runs = [median_curve(curves, name, [r for r, _ in done]) for name, done in by_seed.items()]
        if args.plot:
            curves.draw(runs, args.plot, args.window)
    if model is not None:
        notes.append("The hf_* configs (and the rows marked tiny HF policy) train the tiny "
                     "random Qwen2 of "
                     "`python -m lightning_adv make-tiny` (about 290 tokens).")
    if args.override:
        notes.append("Overrides: `" + " ".join(args.override) + "`.")
    notes.append("Whole command, start-up included: " + "; ".join(commands) + ".")
    notes.append(f"Load average after: {load_average()}.")
    about = (f"Start: the untrained policy (step 0) and the mean of the first {args.window} "
             f"steps; end: the mean of the last {args.window} steps; wall time: first to "
             f"last training step, from the event timestamps.")
    if args.seeds:
        about = (f"Each config at the seeds {', '.join(map(str, args.seeds))} (one run at a "
                 f"time). Each cell is the median over the seeds and, in brackets, the lowest "
                 f"and the highest: start and end are the mean `train/task_reward` of the first "
                 f"and last {args.window} steps; the validation is the run's last "
                 f"`val/reward_greedy`. The picture shows the median curve of each config.")
        table = seed_table(by_seed, args.window)
    else:
        table = curves.table(runs, args.window)
    sections = [about + "\n", table, "\n".join(notes) + "\n"]
    if args.plot and args.page:
        picture = os.path.relpath(args.plot, args.page.parent)
        sections.append(f"![reward curves]({picture})\n")
    harness.write_page(args.page, header, sections, deterministic=DETERMINISTIC)


if __name__ == "__main__":
    main()
