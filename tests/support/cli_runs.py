"""Running the CLI in process, as the CLI, trainer and distributed tests do: the shipped
configs, the small-run flags, a fit, a fit that must fail, and the TensorBoard scalars of
a run directory."""

from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_adv.cli import main

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
SHIPPED = ["ppo", "grpo", "dr_grpo", "turn_gae", "gvpo_prm", "grpo_dynamic", "turn_rloo", "gigpo",
           "vine", "gtpo", "grpo_reverse", "tree_grpo", "treerl"]
SMALL = ["--trainer.limit_train_batches=2", "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false", "--model.ppo.prompts_per_step=4",
         "--model.ppo.n_samples=4", "--model.ppo.minibatches=2", "--model.ppo.epochs=1",
         "--model.evaluation.num_prompts=8"]


def fit(config: str, save_dir: Path, *extra: str) -> None:
    # SMALL's 4 responses per prompt: the leaves of a binary tree of depth 2
    trees = ["--model.ppo.tree.depth=2"] if config.startswith("tree") else []
    main(["fit", "--config", str(CONFIGS / f"{config}.yaml"),
          f"--trainer.logger.init_args.save_dir={save_dir}", *SMALL, *trees, *extra])


def failed_fit(config: str, save_dir: Path, override: str | tuple[str, ...], capsys
               ) -> tuple[int, str]:
    """Run a fit that must stop with SystemExit; its exit code and stderr."""
    overrides = (override,) if isinstance(override, str) else override
    with pytest.raises(SystemExit) as exit_info:
        fit(config, save_dir, *overrides)
    return exit_info.value.code, capsys.readouterr().err


def scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    out = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    out["histograms"] = {tag: [e.step for e in events.Histograms(tag)]
                         for tag in events.Tags()["histograms"]}
    return out
