"""``python -m lightning_adv.bench_trainer``: the built-in trainer's step, time per phase.

Runs N training steps of each shipped config with a real ``lightning.Trainer`` twice,
side by side in one process: as the step is now (KV-cache sampling that also yields the
critic's values, fused AdamW) and as it was (every new token re-reads its whole prefix, a
separate forward pass for the values, the unfused AdamW loop). Reports steps per second
and the time of each phase: sampling (generation and the task's reward), scoring (the
policy's and the reference's forward passes), advantages (the ``AdvantageModule``), update
(PPO epochs x minibatches) and logging.

    python -m lightning_adv.bench_trainer --configs ppo turn_gae --steps 20 --threads 1 2

The two variants sample the same episodes (same seeds; log-probs equal to ~1e-6), so
their work per step is the same.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

PHASES = ("sampling", "scoring", "advantages", "update", "logging")
ROOT = Path(__file__).resolve().parents[1]


def _timed_module(base: type, baseline: bool) -> type:
    import torch

    class Timed(base):
        """The trainer with a stopwatch around each phase of the step."""

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

        def configure_optimizers(self):
            if not baseline:
                return super().configure_optimizers()
            params = [p for p in self.policy.parameters() if p.requires_grad]
            return torch.optim.AdamW(params, lr=self.ppo_config.lr,
                                     weight_decay=self.ppo_config.weight_decay)

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


def run_config(name: str, steps: int, baseline: bool) -> dict[str, float]:
    """Seconds per step of each phase (and ``step``) over ``steps`` training steps."""
    import lightning.pytorch as pl
    import yaml

    from lightning_adv.trainer.ppo import PPOModule

    config = yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())
    model = dict(config["model"])
    model["ppo"] = {**model.get("ppo", {}), "kv_cache": not baseline}
    pl.seed_everything(config.get("seed_everything", 0), verbose=False)
    module = _timed_module(PPOModule, baseline)(**model)
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=steps, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module)
    return {k: v / module.steps_timed for k, v in module.phase_seconds.items()}


def report(name: str, threads: int, old: dict[str, float], new: dict[str, float]) -> str:
    lines = [f"{name}.yaml, {threads} thread(s): {1 / old['step']:.2f} -> "
             f"{1 / new['step']:.2f} steps/s ({old['step'] / new['step']:.2f}x)",
             "  phase        before (ms)  now (ms)  share now"]
    for phase in PHASES:
        lines.append(f"  {phase:<11} {1000 * old.get(phase, 0):>11.1f} {1000 * new.get(phase, 0):>9.1f}"
                     f" {100 * new.get(phase, 0) / new['step']:>9.0f}%")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=["ppo", "turn_gae"])
    parser.add_argument("--steps", type=int, default=10, help="training steps per run")
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    args = parser.parse_args(argv)
    import torch

    print(f"load average {os.getloadavg()[0]:.2f}; torch {torch.__version__}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name in args.configs:
            old = run_config(name, args.steps, baseline=True)
            new = run_config(name, args.steps, baseline=False)
            print(report(name, threads, old, new), flush=True)


if __name__ == "__main__":
    main()
