"""Regenerate the README's measured numbers: install time, run times and the learning table.

    python scripts/readme_numbers.py --configs ppo turn_gae grpo dr_grpo --install \
        --out docs/learning.md --plot docs/reward_curves.png

For each config, runs ``python -m lightning_adv fit --config configs/<name>.yaml`` as the
README's first command does (one at a time, logs under a temporary directory), timing the
whole command (the Hugging Face configs, ``hf_*``, train the tiny model that
``python -m lightning_adv make-tiny`` writes, made once in the temporary directory
first); then reads the runs' TensorBoard events with ``scripts/reward_curve.py``
for the table and the curves. With ``--install`` it first times the README's install step
alone (a fresh virtual environment, ``pip install -c constraints.txt -e .``), once with
pip's cache warm and once with ``--no-cache-dir``, as a new user's machine would run it.
The markdown it writes states the machine (cores, load average before and after) and the
date, so the README can quote it as is.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from reward_curve import draw, load, table  # noqa: E402


def timed(command: list[str], **kwargs) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, **kwargs)
    return time.perf_counter() - start


def time_install(workdir: Path, use_cache: bool = True) -> float:
    venv = workdir / ("venv" if use_cache else "venv-no-cache")
    python = venv / "bin" / "python"
    cache = [] if use_cache else ["--no-cache-dir"]
    return timed([sys.executable, "-m", "venv", str(venv)]) + timed(
        [str(python), "-m", "pip", "install", "-q", *cache, "-c", "constraints.txt", "-e", "."],
        cwd=ROOT)


def make_tiny_model(workdir: Path) -> Path:
    out = workdir / "tiny_lm"
    subprocess.run([sys.executable, "-m", "lightning_adv", "make-tiny", "--out", str(out)],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return out


def run_config(name: str, save_dir: Path, overrides: list[str]) -> tuple[float, Path]:
    if name.startswith("hf_"):
        overrides = [f"--model.policy.pretrained={make_tiny_model(save_dir.parent)}", *overrides]
    seconds = timed([sys.executable, "-m", "lightning_adv", "fit", "--config",
                     f"configs/{name}.yaml", f"--trainer.logger.init_args.save_dir={save_dir}",
                     "--trainer.enable_progress_bar=false", *overrides], cwd=ROOT,
                    stdout=subprocess.DEVNULL)
    return seconds, save_dir / name / "version_0"


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=["ppo", "turn_gae"],
                        help="names under configs/ (default: ppo turn_gae)")
    parser.add_argument("--install", action="store_true", help="also time the install step")
    parser.add_argument("--out", type=Path, help="markdown to write (also printed)")
    parser.add_argument("--plot", type=Path, help="PNG of the reward curves")
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--override", action="append", default=[],
                        help="extra CLI argument for every run (--override=--model.ppo.lr=0.001)")
    args = parser.parse_args()

    lines = [f"Measured {datetime.date.today().isoformat()} on {platform.machine()}, "
             f"{os.cpu_count()} cores, Python {platform.python_version()}; load average "
             f"(1/5/15 min) before: {load_average()}."]
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        if args.install:
            warm, cold = time_install(tmp_path), time_install(tmp_path, use_cache=False)
            lines.append(f"Install (`python3 -m venv` + `pip install -c constraints.txt -e .`): "
                         f"{warm:.0f} s with pip's cache warm, {cold:.0f} s with "
                         f"`--no-cache-dir` (every package but the local torch wheel downloaded "
                         f"from PyPI).")
        runs, commands = [], []
        for name in args.configs:
            seconds, log_dir = run_config(name, tmp_path / "runs", args.override)
            commands.append(f"`fit --config configs/{name}.yaml`: {seconds:.0f} s")
            runs.append(load(log_dir, f"{name}.yaml"))
        if args.override:
            lines.append("Overrides: `" + " ".join(args.override) + "`.")
        lines.append("Whole command, start-up included: " + "; ".join(commands) + ".")
        lines.append(f"Load average after: {load_average()}.")
        text = table(runs, args.window) + "\n" + "\n".join(lines) + "\n"
        if args.plot:
            draw(runs, args.plot, args.window)
    print(text, end="")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
