"""Where the CLI's commands write: the parsed config's logger and checkpoint settings,
adjusted (on a copy of the config) before anything is instantiated.

- A resumed ``fit`` continues in its checkpoint's run directory only when
  :func:`~lightning_adv.trainer.run.resume.resume_target` says so (:func:`continue_in`);
  otherwise it takes the next free ``version_N`` (:func:`new_version`), and its saved
  config begins with comment lines naming its parent run and checkpoint
  (:func:`parent_lines`).
- ``validate``, ``test`` and ``predict`` write into ``eval/<command>_N`` inside the
  checkpoint's run directory (or under the logger's directory without a run checkpoint),
  never into a new ``version_N`` among the training runs (:func:`place_evaluation`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import jsonargparse

from lightning_adv.trainer.run.callbacks import next_version_dir
from lightning_adv.trainer.run.resume import ResumeTarget, describe, run_dir_of

#: the subcommands that only evaluate a checkpoint
EVALUATION_COMMANDS = ("validate", "test", "predict")


def tensorboard_logger(trainer: Any) -> Optional[Any]:
    """The trainer section's TensorBoardLogger (a parsed ``class_path`` namespace), or None."""
    logger = trainer.get("logger")
    if isinstance(logger, jsonargparse.Namespace) and str(
            logger.get("class_path", "")).endswith("TensorBoardLogger"):
        return logger
    return None


def logger_dir(trainer: Any) -> Optional[Path]:
    """``save_dir/name`` of the trainer's TensorBoardLogger: where its ``version_N`` go."""
    logger = tensorboard_logger(trainer)
    if logger is None:
        return None
    init = logger.init_args
    return Path(init.save_dir or ".") / (init.name or "")


def next_free(directory: Path, prefix: str) -> Path:
    """``directory/<prefix>N`` with the first N not taken."""
    n = 0
    while (directory / f"{prefix}{n}").exists():
        n += 1
    return directory / f"{prefix}{n}"


def checkpoint_callbacks(trainer: Any) -> list[Any]:
    return [c for c in trainer.get("callbacks") or []
            if str(c.get("class_path", "")).endswith("Checkpoint")]


def continue_in(trainer: Any, run_dir: Path, step: int) -> None:
    """Log into ``run_dir`` again from training step ``step`` on."""
    logger = tensorboard_logger(trainer)
    logger.init_args.version = run_dir.name
    # TensorBoard drops the events from `step` on: those of the continuation this run
    # replaces (only ever with --overwrite_run; otherwise there are none).
    logger.dict_kwargs = {**(logger.get("dict_kwargs") or {}), "purge_step": step}
    for callback in checkpoint_callbacks(trainer):
        # A later checkpoint of the same name is replaced, not versioned (last.ckpt stays last).
        callback.init_args.enable_version_counter = False


def new_version(trainer: Any) -> Optional[Path]:
    """Pin the TensorBoardLogger to the next free ``version_N`` (a config's explicit
    ``version`` might be the parent's); returns it (None without a TensorBoardLogger)."""
    directory = logger_dir(trainer)
    if directory is None:
        return None
    run = next_version_dir(directory)
    tensorboard_logger(trainer).init_args.version = run.name
    return run


def parent_lines(target: ResumeTarget, ckpt: str, info: dict[str, Any],
                 changed: list[tuple[str, Any, Any]]) -> list[str]:
    """The comment lines a resumed run's saved config begins with: where it came from."""
    lines = [f"# Resumed at training step {info['step']} from the checkpoint "
             f"{Path(ckpt).resolve()}"]
    if target.parent is not None and not target.in_place:
        lines.append(f"# parent run: {target.parent} (left as it was)")
    if changed:
        lines.append(f"# settings that differ from the parent's: {describe(changed)}")
    return lines


def place_evaluation(config: Any, subcommand: str, unlogged_root: Path) -> Path:
    """Send ``validate``/``test``/``predict`` outputs (logs, config, predictions) to
    ``eval/<command>_N``: inside the checkpoint's run directory when it has one, else
    under the logger's directory (``runs/<name>/eval``) or ``unlogged_root/eval``.
    Returns that directory."""
    trainer = config.trainer
    ckpt = config.get("ckpt_path")
    run_dir = run_dir_of(ckpt) if ckpt and Path(ckpt).is_file() else None
    base = run_dir or logger_dir(trainer) or unlogged_root
    target = next_free(base / "eval", f"{subcommand}_")
    logger = tensorboard_logger(trainer)
    if logger is not None:
        logger.init_args.save_dir = str(target.parent.parent)
        logger.init_args.name = "eval"
        logger.init_args.version = target.name
    elif not trainer.get("logger"):
        trainer.default_root_dir = str(target)
    return target
