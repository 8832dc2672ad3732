"""The CLI's checks and rewrites of its arguments: the ``trainer`` section's step counts,
runs that would do nothing, an empty config file, the checkpoint callbacks, and the stage
shorthand flags (:func:`stage_shorthands`).

Lightning reads ``limit_train_batches: 1.0`` as "the whole epoch" and refuses a negative
limit deep inside ``fit`` with a traceback; ``limit_train_batches: 0`` or
``max_epochs: 0`` "train" zero steps and exit 0 with an empty run directory. Here each
is ``error: trainer.<key>: ...`` before anything is built (:func:`trainer_errors`), and an
integral count is a count (:func:`as_step_count`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

import yaml

STAGE_FLAG = re.compile(r"--model\.actor\.advantage\.(compute|outcome_reward_shaping|estimator|"
                        r"process_adv_shaping)")

#: trainer keys that count batches (training steps) when integral, fractions of an epoch below 1
STEP_COUNT_KEYS = ("limit_train_batches", "limit_val_batches", "limit_test_batches",
                   "limit_predict_batches", "val_check_interval")

#: keys whose 0 turns a ``fit`` into a run that trains nothing
NO_OP_AT_ZERO = {
    "limit_train_batches": "the number of training steps (300 in the shipped configs)",
    "max_epochs": "the number of passes over limit_train_batches steps (1 in the shipped configs)",
    "max_steps": "-1 (no limit; it counts optimizer steps) or a positive count",
}


def as_step_count(value: Any) -> Any:
    """An integral number of steps as an ``int``: ``1`` must stay one step, whichever way
    jsonargparse resolved ``int | float`` (``1.0`` would be Lightning's "100%")."""
    if isinstance(value, float) and value >= 1 and value.is_integer():
        return int(value)
    return value


def _count_error(key: str, value: Any) -> Optional[str]:
    if value is None:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if key == "val_check_interval":
        if number and (isinstance(value, int) and value >= 1 or isinstance(value, float)
                       and 0 < value <= 1):
            return None
        return (f"trainer.{key}: expected a number of training steps (an integer >= 1) or a "
                f"fraction of the epoch in (0, 1], got {value!r}")
    if number and (isinstance(value, int) and value >= 0 or isinstance(value, float)
                   and 0 <= value <= 1):
        return None
    what = "training steps" if key == "limit_train_batches" else "batches"
    return (f"trainer.{key}: expected a number of {what} (an integer >= 0) or a fraction of "
            f"the epoch in [0, 1], got {value!r}")


def trainer_errors(trainer: Mapping[str, Any], subcommand: Optional[str]) -> Optional[str]:
    """The first problem of the ``trainer`` section as ``trainer.<key>: ...``, or None."""
    for key in STEP_COUNT_KEYS:
        error = _count_error(key, trainer.get(key))
        if error:
            return error
    for key in ("max_epochs", "max_steps"):
        value = trainer.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < -1):
            return f"trainer.{key}: expected -1 (no limit) or a count >= 0, got {value!r}"
    if subcommand == "fit":
        if trainer.get("max_epochs") == -1 and trainer.get("max_steps") in (None, -1) \
                and trainer.get("max_time") is None:
            # Lightning's -1 means "no end" only when nothing else bounds the run.
            return ("trainer.max_epochs: -1 trains without end (neither trainer.max_steps nor "
                    "trainer.max_time bounds it); expected a number of epochs >= 1, or -1 with "
                    "--trainer.max_steps=N (optimizer steps) or --trainer.max_time")
        for key, instead in NO_OP_AT_ZERO.items():
            if trainer.get(key) == 0:
                return (f"trainer.{key}: 0 trains nothing (fit would only write an empty run "
                        f"directory); give {instead}")
    return None


def steps_per_epoch(trainer: Mapping[str, Any], num_prompts: int, prompts_per_step: int) -> int:
    """Training steps of one epoch: the pool's steps, cut by ``limit_train_batches``."""
    steps = num_prompts // prompts_per_step
    limit = trainer.get("limit_train_batches")
    if isinstance(limit, int):
        return min(steps, limit)
    if isinstance(limit, float):
        return int(steps * limit)
    return steps


def config_files(args: list[str]) -> list[str]:
    """The ``--config`` files of ``args``, in order."""
    found = []
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            found.append(args[i + 1])
        elif arg.startswith("--config="):
            found.append(arg.split("=", 1)[1])
    return found


def _load(path: str) -> Any:
    try:
        return yaml.safe_load(Path(path).read_text()) if Path(path).is_file() else None
    except (OSError, yaml.YAMLError):
        return None


def config_file_error(args: list[str]) -> Optional[str]:
    """The first ``--config`` file of ``args`` that is not YAML (jsonargparse's message
    for it names no file) or that holds no settings (its message: "Unexpected config:")."""
    for path in config_files(args):
        if not Path(path).is_file():
            continue  # jsonargparse says so
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            return f"--config: {path!r} is not valid YAML: {problem}{where}"
        if loaded is None:
            return (f"--config: {path!r} is empty (it holds no settings); give a YAML file "
                    f"such as configs/ppo.yaml")
    return None


def null_section_error(model: Mapping[str, Any], sections: Any, args: list[str]) -> Optional[str]:
    """A ``model`` section given as null (``ppo:`` with every key commented out) would reset
    the whole section to its defaults, undoing the configs before it: refused, naming the
    file that sets it."""
    for name in sections:
        if name in model and model[name] is None:
            where = next((f" in {path}" for path in reversed(config_files(args))
                          if isinstance(_load(path), dict)
                          and isinstance(_load(path).get("model"), dict)
                          and name in _load(path)["model"] and _load(path)["model"][name] is None),
                         "")
            return (f"model.{name}: expected a mapping of settings, got null{where} (a "
                    f"section whose keys are all commented out?); null would reset every "
                    f"model.{name} setting to its default. Remove the empty `{name}:` line to "
                    f"keep the settings of the configs before it")
    return None


#: Lightning's ModelCheckpoint as a config names it, and the subclass the CLI uses instead
#: (it counts training steps, not optimizer steps)
LIGHTNING_CHECKPOINT_PATHS = ("lightning.pytorch.callbacks.ModelCheckpoint",
                              "lightning.pytorch.callbacks.model_checkpoint.ModelCheckpoint",
                              "pytorch_lightning.callbacks.ModelCheckpoint")
TRAINING_STEP_CHECKPOINT = "lightning_adv.trainer.run.callbacks.TrainingStepCheckpoint"


def use_training_step_checkpoints(trainer: Any) -> None:
    """The parsed ``trainer`` section's checkpoint callbacks, adjusted in place: removed
    when ``enable_checkpointing`` is false (the shipped configs list one, which Lightning
    would refuse), and Lightning's ``ModelCheckpoint`` replaced by
    :class:`~lightning_adv.trainer.run.callbacks.TrainingStepCheckpoint`, so a checkpoint
    folder speaks one unit (training steps, as the Ctrl-C checkpoint and every other step
    count of the CLI)."""
    if trainer.get("enable_checkpointing") is False and trainer.get("callbacks"):
        trainer.callbacks = [c for c in trainer.callbacks
                             if not str(c.get("class_path", "")).endswith("Checkpoint")]
    for callback in trainer.get("callbacks") or []:
        if str(callback.get("class_path")) in LIGHTNING_CHECKPOINT_PATHS:
            callback.class_path = TRAINING_STEP_CHECKPOINT


def stage_shorthands(args: list[str]) -> list[str]:
    """``--model.actor.advantage.<stage>=<name or path>`` means ``{implementation: <name>,
    kwargs: {}}``, so later flags on the same line (``...<stage>.kwargs.x=1``) refine it."""
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        match = STAGE_FLAG.fullmatch(arg.split("=", 1)[0])
        if match and "=" in arg:
            flag, value = arg.split("=", 1)
        elif match and i + 1 < len(args) and not args[i + 1].startswith("--"):
            flag, value = arg, args[i + 1]
            i += 1
        else:
            out.append(arg)
            i += 1
            continue
        bare = (value and value[0] not in "{[" and value.lower() not in ("null", "none")
                and not Path(value).is_file())
        out.append(f"{flag}={{implementation: {value}, kwargs: {{}}}}" if bare else f"{flag}={value}")
        i += 1
    return out
