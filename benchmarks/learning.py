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

``--install`` first times the README's install step alone (a fresh virtual environment
and ``pip install -c constraints.txt -e .``), once with pip's cache warm and once with
``--no-cache-dir``, as on a new user's machine. The runs use the CLI's own thread
settings (``torch_num_threads: 1``), like the README's command.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
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
               model: Optional[Path]) -> tuple[float, Path]:
    """Train ``configs/<name>.yaml``; the whole command's seconds and the run's log dir."""
    if model is not None:
        overrides = [f"--model.policy.pretrained={model}", *overrides]
    seconds = timed([sys.executable, "-m", "lightning_adv", "fit", "--config",
                     f"configs/{name}.yaml", f"--trainer.logger.init_args.save_dir={save_dir}",
                     "--trainer.enable_progress_bar=false", *overrides],
                    cwd=ROOT, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return seconds, save_dir / name / "version_0"


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=["ppo", "turn_gae"],
                        help="names under configs/ (default: ppo turn_gae)")
    parser.add_argument("--install", action="store_true", help="also time the install step")
    parser.add_argument("--window", type=int, default=10,
                        help="steps averaged for the start and end rewards")
    parser.add_argument("--override", action="append", default=[],
                        help="extra CLI argument for every run (--override=--model.ppo.lr=0.001)")
    parser.add_argument("--plot", type=Path, help="PNG of the reward curves")
    parser.add_argument("--page", type=Path, help="also write the results as a markdown page")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    unknown = [n for n in args.configs if not (ROOT / "configs" / f"{n}.yaml").is_file()]
    if unknown:
        parser.error(f"--configs: no configs/<name>.yaml for {' '.join(unknown)}")
    if args.window < 1:
        parser.error(f"--window: expected at least 1, got {args.window}")
    curves = reward_curve_module()
    before = load_average()
    header = harness.page_header("Learning: the shipped configs as a user runs them", [
        "Threads: the CLI's default (torch_num_threads 1); OMP_WAIT_POLICY="
        f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}",
        f"lightning_adv from {ROOT / 'lightning_adv'}"])
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
        if any(n.startswith("hf_") for n in args.configs):
            model = harness.make_tiny_model(ROOT, tmp_path / "tiny_lm")
        runs, commands = [], []
        for name in args.configs:
            seconds, log_dir = run_config(name, tmp_path / "runs", args.override,
                                          model if name.startswith("hf_") else None)
            commands.append(f"`fit --config configs/{name}.yaml`: {seconds:.0f} s")
            runs.append(curves.load(log_dir, f"{name}.yaml"))
        if args.plot:
            curves.draw(runs, args.plot, args.window)
    if model is not None:
        notes.append("The hf_* configs train the tiny random Qwen2 of "
                     "`python -m lightning_adv make-tiny` (about 290 tokens).")
    if args.override:
        notes.append("Overrides: `" + " ".join(args.override) + "`.")
    notes.append("Whole command, start-up included: " + "; ".join(commands) + ".")
    notes.append(f"Load average after: {load_average()}.")
    about = (f"Start: the untrained policy (step 0) and the mean of the first {args.window} "
             f"steps; end: the mean of the last {args.window} steps; wall time: first to "
             f"last training step, from the event timestamps.")
    sections = [about + "\n", curves.table(runs, args.window), "\n".join(notes) + "\n"]
    if args.plot and args.page:
        picture = os.path.relpath(args.plot, args.page.parent)
        sections.append(f"![reward curves]({picture})\n")
    harness.write_page(args.page, header, sections, deterministic=DETERMINISTIC)


if __name__ == "__main__":
    main()
