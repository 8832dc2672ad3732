"""Each prompt read once, against every row read whole: the trainer's phases, in one process.

``benchmarks/trainer_step.py`` compares commits in separate processes, which a loaded
machine drowns in noise when the difference is a few tens of milliseconds. This script
trains ``--config`` (default ``configs/hf_grpo.yaml``) on the tiny model of ``make-tiny``
in one process on one thread, alternating ``--repeats`` times between a module whose
Hugging Face policy and reference read each shared prompt once (the trainer's default)
and one whose passes read every row whole (its prompt groups ignored), each
for ``--steps`` training steps after ``--warmup`` untimed ones; the same seed, so the same
prompts. It reports the median milliseconds per step of each phase (sampling, scoring,
update) and their ratio::

    python benchmarks/prompt_sharing.py --steps 6 --repeats 3 --page docs/benchmarks/prompt-sharing-ab.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import harness

#: each phase's method: (the attribute of the module that holds it, or "" for the module)
PHASES = {"sampling": ("", "rollout"), "scoring": ("", "make_batch"),
          "update": ("updater", "step")}
SIDES = ("whole rows", "each prompt once")


def run_side(config: dict[str, Any], share: bool, steps: int, warmup: int, out: Path
             ) -> dict[str, float]:
    """Milliseconds per step of each phase (median over the timed steps) for one fit."""
    import contextlib
    from unittest import mock

    import lightning.pytorch as pl

    from lightning_adv.trainer import PPOModule

    module = PPOModule(**config)
    # whole rows: the policy's and the reference's passes are given no prompt groups to share
    whole_rows = mock.patch("lightning_adv.trainer.policies.hf.policy._shared",
                            lambda *args: None)
    times: dict[str, list[float]] = defaultdict(list)
    for phase, (holder, name) in PHASES.items():
        owner = getattr(module, holder) if holder else module
        method = getattr(owner, name)

        def timed(*args: Any, _method: Any = method, _phase: str = phase, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                times[_phase].append(time.perf_counter() - start)

        setattr(owner, name, timed)
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=warmup + steps, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1,
                         default_root_dir=str(out))
    with contextlib.nullcontext() if share else whole_rows:
        trainer.fit(module)
    return {phase: 1e3 * statistics.median(values[warmup:]) for phase, values in times.items()}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/prompt_sharing.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=harness.ROOT / "configs" / "hf_grpo.yaml")
    parser.add_argument("--steps", type=int, default=6, help="timed training steps per fit")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before them")
    parser.add_argument("--repeats", type=int, default=3, help="fits of each side, alternating")
    parser.add_argument("--page", type=Path, help="also write the results as a markdown page")
    args = parser.parse_args(argv)
    if min(args.steps, args.repeats) < 1 or args.warmup < 0:
        parser.error("--steps and --repeats must be at least 1, --warmup at least 0")
    harness.set_thread_environment(1)
    import torch
    import yaml

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    model_section = yaml.safe_load(args.config.read_text())["model"]
    if not (model_section.get("policy") or {}).get("pretrained"):
        parser.error(f"--config: {args.config} has no model.policy.pretrained (a Hugging Face policy)")
    with tempfile.TemporaryDirectory(prefix="prompt_sharing_") as tmp:
        model = harness.make_tiny_model(harness.ROOT, Path(tmp) / "tiny_lm")
        model_section["policy"]["pretrained"] = str(model)
        data = model_section.get("task", {}).get("dataset")
        if data and not Path(data).is_absolute():
            model_section["task"]["dataset"] = str(harness.ROOT / data)
        config = {**model_section, "seed": 0}
        runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
        for i in range(args.repeats):
            for side in SIDES[::1 if i % 2 == 0 else -1]:
                runs[side].append(run_side(config, side == SIDES[1], args.steps, args.warmup,
                                           Path(tmp) / f"run{i}"))
    header = harness.page_header("Each prompt read once, against whole rows", [
        f"Threads: {harness.thread_note([1])}; one process, the two sides alternating",
        f"Config: {args.config.name} on the tiny model of `make-tiny`; {args.steps} timed "
        f"step(s) after {args.warmup} untimed one(s) per fit; {args.repeats} fit(s) per side"])
    rows = []
    for phase in [*PHASES, "total"]:
        def median(side: str) -> float:
            return statistics.median(sum(r.values()) if phase == "total" else r[phase]
                                     for r in runs[side])
        whole, shared = median(SIDES[0]), median(SIDES[1])
        rows.append([phase, f"{whole:.1f}", f"{shared:.1f}", harness.format_ratio(whole / shared)])
    print(header)
    harness.write_page(args.page, header, [
        "Milliseconds per step, medians over the fits of each phase's median step; the ratio "
        "is whole rows ÷ each prompt once (above 1: reading each prompt once is faster). "
        "`total` is the three phases, not the whole step (advantages and logging are the "
        "same code on both sides).\n",
        harness.table(["phase", *(f"{s} (ms)" for s in SIDES), "ratio"], rows)])


if __name__ == "__main__":
    main(sys.argv[1:])
