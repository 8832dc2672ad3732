"""Steps per second of the built-in trainer, side by side against a baseline commit.

For each of ``--configs`` it runs ``--steps`` timed training steps (after ``--warmup``
untimed ones) of ``configs/<name>.yaml`` with a real ``lightning.Trainer``, each run in a
fresh process that imports one tree's package (``PYTHONPATH``) on ``--threads`` intra-op
threads: this checkout's (or ``--candidate REV``'s), and the baseline's (``--baseline``,
default ``a7e96eb``: the commit before the package's restructuring), extracted with
``git archive`` and its C extension compiled as ``pip install`` would. The two sides
alternate, ``--repeats`` times (baseline then candidate, then the other way round, so a
load that drifts favours neither). It reports each side's median steps/s, their ratio,
the ratio of each pair of runs, and the median time per phase (sampling, scoring,
advantages, update, logging) where both versions have the method it times.

Configs whose policy is a pretrained Hugging Face model (``hf_grpo``, ``hf_ppo``) train
the tiny model the candidate tree's ``make-tiny`` command writes (or ``--model DIR``),
the same files for both sides::

    python benchmarks/trainer_step.py --configs ppo hf_grpo --steps 20 --repeats 5
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

DEFAULT_BASELINE = "a7e96eb"
#: The PPOModule method each phase times, where the module has it: the first of its
#: dotted paths that names one (``updater.step``: the update since the Policy interface
#: refactor; ``update`` before it).
PHASE_METHODS = {"sampling": ("rollout",), "scoring": ("make_batch",),
                 "update": ("updater.step", "update"), "logging": ("log_step",)}
PHASES = ("sampling", "scoring", "advantages", "update", "logging")


# ---------------------------------------------------------------------------- child side


def _attach_phase_timers(module: Any, seconds: dict[str, float]) -> None:
    """Add each phase's time per call into ``seconds``: the methods of
    :data:`PHASE_METHODS` the module has, and its ``advantage`` submodule's calls."""
    import torch

    def timed(method: Any, phase: str) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                seconds[phase] += time.perf_counter() - start
        return run

    for phase, paths in PHASE_METHODS.items():
        for path in paths:
            *holders, name = path.split(".")
            owner = module
            for holder in holders:
                owner = getattr(owner, holder, None)
            method = getattr(owner, name, None)
            if callable(method):
                setattr(owner, name, timed(method, phase))
                break
    advantage = getattr(module, "advantage", None)
    if isinstance(advantage, torch.nn.Module):
        started: list[float] = []
        advantage.register_forward_pre_hook(lambda *_: started.append(time.perf_counter()))

        def done(*_: Any) -> None:
            seconds["advantages"] += time.perf_counter() - started.pop()
        advantage.register_forward_hook(done)


def _step_timer(warmup: int, seconds: dict[str, float]) -> Any:
    """A callback that times the training steps after the first ``warmup`` ones (from
    the start of the first to the end of the last) and clears ``seconds`` after warm-up."""
    import lightning.pytorch as pl

    class StepTimer(pl.Callback):
        def __init__(self) -> None:
            self.start: Optional[float] = None
            self.end: Optional[float] = None
            self.timed = 0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if batch_idx == warmup:
                seconds.clear()
                self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if batch_idx >= warmup:
                self.timed += 1
                self.end = time.perf_counter()

    return StepTimer()


def measure(config_path: Path, steps: int, warmup: int, threads: int,
            model: Optional[str]) -> dict[str, Any]:
    """Seconds per training step, and per phase, of ``steps`` steps of one config with the
    ``lightning_adv`` of the current directory's tree (run in a child process)."""
    harness.set_thread_environment(threads)
    import torch

    torch.set_num_threads(threads)
    import lightning.pytorch as pl
    import yaml

    home = harness.check_package_home(Path.cwd())
    from lightning_adv.trainer import PPOModule

    config = yaml.safe_load(config_path.read_text())
    model_args = config["model"]
    if model is not None:
        model_args["policy"]["pretrained"] = model
    pl.seed_everything(config.get("seed_everything", 0), verbose=False)
    module = PPOModule(**model_args)
    seconds: dict[str, float] = defaultdict(float)
    _attach_phase_timers(module, seconds)
    timer = _step_timer(warmup, seconds)
    # (a run directory of its own: the trainer saves a Hugging Face policy there at the end)
    with tempfile.TemporaryDirectory(prefix="trainer_step_run_") as run_dir, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # (no validation: a dataset config holds out prompts, and they are not timed)
        trainer = pl.Trainer(max_epochs=1, limit_train_batches=warmup + steps, limit_val_batches=0,
                             logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, accelerator="cpu", devices=1,
                             callbacks=[timer], default_root_dir=run_dir)
        trainer.fit(module)
    if timer.timed != steps:
        raise RuntimeError(f"{config_path.name}: {timer.timed} of {steps} timed steps ran (one "
                           f"epoch of this config has fewer than {warmup + steps} steps)")
    return {"step": (timer.end - timer.start) / steps, "package": home,
            "phases": {phase: total / steps for phase, total in seconds.items()}}


# ---------------------------------------------------------------------------- parent side


def config_path(tree: Path, name: str) -> Path:
    return tree / "configs" / (name if name.endswith(".yaml") else f"{name}.yaml")


def check_configs(parser: argparse.ArgumentParser, names: Sequence[str],
                  trees: dict[str, Path]) -> None:
    for side, tree in trees.items():
        missing = [name for name in names if not config_path(tree, name).is_file()]
        if missing:
            parser.error(f"--configs: {', '.join(missing)} not in the {side} tree's configs/")


def needs_model(path: Path) -> bool:
    import yaml

    return bool(((yaml.safe_load(path.read_text()).get("model") or {}).get("policy") or {})
                .get("pretrained"))


def run_side(tree: Path, name: str, args: argparse.Namespace, model: Optional[Path]
             ) -> dict[str, Any]:
    command = [str(Path(__file__).resolve()), "--child", str(config_path(tree, name)),
               "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--threads", str(args.threads)]
    if model is not None:
        command += ["--model", str(model)]
    return harness.run_child(command, tree, args.threads, f"{name} with the package of {tree}")


def _steps_per_s(runs: list[dict[str, Any]]) -> list[float]:
    return [1 / run["step"] for run in runs]


def summary_table(results: dict[str, dict[str, list[dict[str, Any]]]], labels: dict[str, str]
                  ) -> str:
    rows = []
    for name, runs in results.items():
        old, new = _steps_per_s(runs["baseline"]), _steps_per_s(runs["candidate"])
        pairs = [n / o for o, n in zip(old, new, strict=True)]
        rows.append([name, f"{statistics.median(old):.2f}", f"{statistics.median(new):.2f}",
                     f"{statistics.median(new) / statistics.median(old):.3f}",
                     f"{min(pairs):.3f}–{max(pairs):.3f} (median {statistics.median(pairs):.3f})",
                     ", ".join(f"{v:.2f}" for v in old), ", ".join(f"{v:.2f}" for v in new)])
    return ("Steps per second, medians over the runs; the ratio is candidate ÷ baseline "
            "(above 1: the candidate is faster); run by run: each candidate run against the "
            "baseline run next to it.\n\n"
            + harness.table(["config", f"{labels['baseline']} steps/s",
                             f"{labels['candidate']} steps/s", "ratio", "run by run",
                             f"{labels['baseline']} runs", f"{labels['candidate']} runs"], rows))


def phase_table(name: str, runs: dict[str, list[dict[str, Any]]], labels: dict[str, str]) -> str:
    def median_ms(side: str, phase: str) -> float:
        return 1e3 * statistics.median(r["phases"].get(phase, 0.0) if phase != "step"
                                       else r["step"] for r in runs[side])

    shared = [p for p in PHASES if all(p in r["phases"] for side in runs for r in runs[side])]
    rows = []
    for phase in [*shared, "step"]:
        old, new = median_ms("baseline", phase), median_ms("candidate", phase)
        rows.append([phase, f"{old:.1f}", f"{new:.1f}",
                     f"{100 * new / median_ms('candidate', 'step'):.0f}%"])
    return (f"### {name}: milliseconds per step, medians\n\n"
            + harness.table(["phase", labels["baseline"], labels["candidate"],
                             "share of the candidate's step"], rows))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python benchmarks/trainer_step.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=["ppo", "hf_grpo"],
                        help="names of configs/*.yaml (default: ppo hf_grpo)")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per run")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed training steps before them (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side, alternating")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    parser.add_argument("--baseline", default=DEFAULT_BASELINE,
                        help=f"the commit to compare with (default {DEFAULT_BASELINE})")
    parser.add_argument("--candidate", help="a commit to measure instead of this checkout's "
                        "working tree")
    parser.add_argument("--model", type=Path, help="the Hugging Face model directory of the "
                        "hf_* configs (default: a tiny one made by the candidate tree)")
    parser.add_argument("--no-build", action="store_true",
                        help="run extracted trees without compiling their C extensions")
    parser.add_argument("--page", type=Path, help="also write the results as a markdown page")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    return parser


def prepare(args: argparse.Namespace, parser: argparse.ArgumentParser, tmp: Path
            ) -> tuple[dict[str, Path], Optional[Path], str]:
    """Both sides' trees (extracted ones built), the model of the hf_* configs, and what
    that model is, for the page."""
    trees = {"baseline": harness.extract_tree(args.baseline, tmp / "baseline"),
             "candidate": harness.ROOT if args.candidate is None
             else harness.extract_tree(args.candidate, tmp / "candidate")}
    check_configs(parser, args.configs, trees)
    for tree in trees.values():
        if tree != harness.ROOT and not args.no_build:
            harness.build_extensions(tree)
    if args.model is not None:
        return trees, args.model, str(args.model)
    if any(needs_model(config_path(trees["candidate"], name)) for name in args.configs):
        return (trees, harness.make_tiny_model(trees["candidate"], tmp / "tiny_lm"),
                "the tiny model of the candidate tree's make-tiny command")
    return trees, None, "none needed"


def compare(args: argparse.Namespace, parser: argparse.ArgumentParser, tmp: Path) -> None:
    trees, model, model_note = prepare(args, parser, tmp)
    labels = {"baseline": args.baseline, "candidate": args.candidate or "this checkout"}
    header = harness.page_header("The trainer's steps per second against a baseline commit", [
        f"Threads: {harness.thread_note([args.threads])}",
        f"{args.steps} timed step(s) after {args.warmup} untimed one(s) per run; "
        f"{args.repeats} run(s) of each side, alternating",
        f"Baseline {args.baseline} = {harness.git('rev-parse', args.baseline + '^{commit}')}",
        *(harness.tree_note(f"{side} ({labels[side]})", tree) for side, tree in trees.items()),
        f"Hugging Face model of the hf_* configs: {model_note}"])
    print(header, flush=True)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for name in args.configs:
        runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "candidate": []}
        for repeat in range(args.repeats):
            for side in ("baseline", "candidate")[::1 if repeat % 2 == 0 else -1]:
                runs[side].append(run_side(trees[side], name, args, model))
                print(f"{name} {labels[side]}: {1 / runs[side][-1]['step']:.2f} steps/s",
                      flush=True)
        results[name] = runs
    sections = [summary_table(results, labels)]
    sections += [phase_table(name, runs, labels) for name, runs in results.items()]
    harness.write_page(args.page, header, sections)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if min(args.steps, args.repeats, args.threads) < 1 or args.warmup < 0:
        parser.error(f"--steps, --repeats and --threads must be at least 1 and --warmup at "
                     f"least 0, got {args.steps}, {args.repeats}, {args.threads} and "
                     f"{args.warmup}")
    if args.child is not None:
        harness.report_result(measure(args.child, args.steps, args.warmup, args.threads,
                                      None if args.model is None else str(args.model)))
        return
    harness.set_thread_environment(args.threads)  # (the children inherit it)
    with tempfile.TemporaryDirectory(prefix="trainer_step_") as tmp:
        compare(args, parser, Path(tmp))


if __name__ == "__main__":
    main(sys.argv[1:])
