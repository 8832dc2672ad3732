"""``python -m lightning_adv.bench_trainer``: the built-in trainer's step, time per phase,
against the step as it was at an earlier commit.

Runs N training steps of each shipped config with a real ``lightning.Trainer``, once with
this checkout's package and once with the package as it was at ``--baseline`` (a commit
of this repository, extracted with ``git archive``), each in a fresh process, alternating
``--repeats`` times, and reports the median steps per second and the median time of each
phase: sampling (generation and the task's reward), scoring (the policy's and the
reference's forward passes), advantages (the ``AdvantageModule``), update (PPO epochs x
minibatches) and logging.

    python -m lightning_adv.bench_trainer --configs ppo turn_gae --steps 20 --threads 1 2

Both versions sample the same episodes (same seeds and weights; the samplers' log-probs
agree to float rounding), so their work per step is the same. Also
``python -m lightning_adv.bench --trainer ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

PHASES = ("sampling", "scoring", "advantages", "update", "logging")
ROOT = Path(__file__).resolve().parents[1]
#: The step before the KV cache, the reused sampler values, fused AdamW and the cheaper
#: update and metrics: the reference the speed-up is measured against.
DEFAULT_BASELINE = "5b04725"


def _timed_module(base: type) -> type:
    """``base`` (a ``PPOModule`` of either version) with a stopwatch around each phase; only
    method names both versions share are wrapped."""

    class Timed(base):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.phase_seconds: dict[str, float] = defaultdict(float)
            self.steps_timed = 0
            advantage = self.advantage
            forward = advantage.forward

            def timed_forward(*a: Any, **k: Any) -> Any:
                with self._phase("advantages"):
                    return forward(*a, **k)
            advantage.forward = timed_forward

        def _phase(self, name: str):
            module = self

            class Stopwatch:
                def __enter__(self):
                    self.start = time.perf_counter()

                def __exit__(self, *exc):
                    module.phase_seconds[name] += time.perf_counter() - self.start
            return Stopwatch()

        def rollout(self, *a: Any, **k: Any):
            with self._phase("sampling"):
                return super().rollout(*a, **k)

        def make_batch(self, *a: Any, **k: Any):
            with self._phase("scoring"):
                return super().make_batch(*a, **k)

        def update(self, *a: Any, **k: Any):
            with self._phase("update"):
                return super().update(*a, **k)

        def log_step(self, *a: Any, **k: Any):
            with self._phase("logging"):
                return super().log_step(*a, **k)

        def training_step(self, *a: Any, **k: Any):
            start = time.perf_counter()
            super().training_step(*a, **k)
            self.phase_seconds["step"] += time.perf_counter() - start
            self.steps_timed += 1

    return Timed


def run_config(name: str, steps: int, configs: Path = ROOT / "configs",
               warmup: int = 2) -> dict[str, float]:
    """Seconds per step of each phase (and ``step``) over ``steps`` training steps of
    ``configs/<name>.yaml``, in this process, with whichever ``lightning_adv`` it imports.
    The first ``warmup`` steps are run but not timed."""
    import lightning.pytorch as pl
    import torch
    import yaml

    from lightning_adv.trainer.ppo import PPOModule

    config = yaml.safe_load((configs / f"{name}.yaml").read_text())
    pl.seed_everything(config.get("seed_everything", 0), verbose=False)
    module = _timed_module(PPOModule)(**config["model"])
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=warmup + steps, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1)

    class ResetAfterWarmup(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if batch_idx == warmup - 1:
                pl_module.phase_seconds.clear()
                pl_module.steps_timed = 0

    trainer.callbacks.append(ResetAfterWarmup())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module)
    del torch
    return {k: v / module.steps_timed for k, v in module.phase_seconds.items()}


def extract(commit: str, into: Path) -> Path:
    """This repository's ``lightning_adv`` package and ``configs`` at ``commit``, unpacked
    under ``into``; returns that directory."""
    archive = into / "source.tar"
    try:
        with archive.open("wb") as out:
            subprocess.run(["git", "-C", str(ROOT), "archive", commit, "lightning_adv", "configs"],
                           stdout=out, stderr=subprocess.PIPE, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        raise SystemExit(f"--baseline {commit}: needs git and this package's repository "
                         f"checkout ({ROOT}): {detail.decode().strip() or exc}") from None
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into


def run_in_process(source: Path, name: str, steps: int, threads: int) -> dict[str, float]:
    """:func:`run_config` in a fresh interpreter that imports ``lightning_adv`` from
    ``source``: each version pays its own imports and nothing leaks between them."""
    code = (f"import json, pathlib, runpy, sys, torch; torch.set_num_threads({threads}); "
            f"sys.path.insert(0, {str(source)!r}); "
            f"import lightning_adv; assert lightning_adv.__file__.startswith({str(source)!r}); "
            # this file's harness, whatever the version under test has
            f"run = runpy.run_path({__file__!r})['run_config']; "
            f"print('TIMINGS', json.dumps(run({name!r}, {steps}, "
            f"pathlib.Path({str(source / 'configs')!r}))))")
    # (imported here: this file also runs inside the baseline's process, which has its own
    # lightning_adv)
    from lightning_adv.openmp import MARKER

    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    if source != ROOT and env.get(MARKER) == env.get("OMP_WAIT_POLICY"):
        # the baseline runs with its own defaults: it did not choose a wait policy
        env.pop("OMP_WAIT_POLICY", None)
        env.pop(MARKER, None)
    return run_reporting(code, env, source, "TIMINGS", f"{name} from {source}")


def run_reporting(code: str, env: dict[str, str], cwd: Path, marker: str, what: str) -> Any:
    """Run ``python -c code`` in ``cwd`` and return the JSON of its last stdout line that
    starts with ``marker``; a failure raises with the end of its stderr."""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=cwd)
    lines = [line for line in run.stdout.splitlines() if line.startswith(marker + " ")]
    if run.returncode or not lines:
        raise RuntimeError(f"{what} failed:\n{run.stderr[-3000:]}")
    return json.loads(lines[-1][len(marker) + 1:])


def median_timings(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r.get(key, 0.0) for r in runs) for key in runs[0]}


def report(name: str, threads: int, old: dict[str, float], new: dict[str, float],
           baseline: str = DEFAULT_BASELINE, repeats: int = 1,
           pair_ratios: Optional[list[float]] = None) -> str:
    """The comparison of one config: the medians' speed-up, and with ``pair_ratios``
    (the speed-up of each run against the baseline run just before it) their range and
    median, which a load that drifts during the benchmark moves less."""
    head = (f"{name}.yaml, {threads} thread(s): {1 / old['step']:.2f} -> "
            f"{1 / new['step']:.2f} steps/s ({old['step'] / new['step']:.2f}x), medians of "
            f"{repeats} run(s)")
    if pair_ratios and len(pair_ratios) > 1:
        head += (f"; run by run {min(pair_ratios):.2f}-{max(pair_ratios):.2f}x, median "
                 f"{statistics.median(pair_ratios):.2f}x")
    lines = [head, f"  phase        {baseline:>8} (ms)  now (ms)  share now"]
    for phase in PHASES:
        lines.append(f"  {phase:<11} {1000 * old.get(phase, 0):>13.1f} "
                     f"{1000 * new.get(phase, 0):>9.1f} {100 * new.get(phase, 0) / new['step']:>9.0f}%")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lightning_adv.bench_trainer",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=["ppo", "turn_gae"])
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per run "
                        "(after 2 untimed ones)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each version, alternating; medians are reported")
    parser.add_argument("--baseline", default=DEFAULT_BASELINE,
                        help=f"the commit to compare with (default {DEFAULT_BASELINE}, the step "
                             f"before this round of speed work)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.repeats < 1:
        parser.error("--steps and --repeats must be at least 1")
    print(f"load average {os.getloadavg()[0]:.2f}; baseline {args.baseline}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        old_source = extract(args.baseline, Path(tmp))
        for threads in args.threads:
            for name in args.configs:
                old_runs, new_runs = [], []
                for _ in range(args.repeats):
                    old_runs.append(run_in_process(old_source, name, args.steps, threads))
                    new_runs.append(run_in_process(ROOT, name, args.steps, threads))
                ratios = [o["step"] / n["step"] for o, n in zip(old_runs, new_runs)]
                print(report(name, threads, median_timings(old_runs), median_timings(new_runs),
                             args.baseline, args.repeats, ratios), flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
