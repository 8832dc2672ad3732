"""The LightningCLI of the trainer: ``python -m lightning_adv fit --config configs/ppo.yaml``.

jsonargparse checks types (and ``Literal`` choices) while parsing; before anything is
instantiated, :meth:`LightningAdvCLI.before_instantiate_classes` builds the model's
config dataclasses, the task, the process scorers and the ``AdvantageModule`` (which
resolves every stage path), so a wrong stage name, a bad kwarg or an unimportable path
is a usage error (exit 2) that names the key, before any model or logger exists.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Optional

import torch
from lightning.pytorch.cli import ArgsType, LightningCLI, LightningArgumentParser

from lightning_adv.trainer.ppo import PPOModule, validate_model_config
from lightning_adv.trainer.tasks import TaskError

TRAINER_DEFAULTS: dict[str, Any] = {
    "logger": {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": "runs", "name": "lightning_adv", "default_hp_metric": False},
    },
    "log_every_n_steps": 1,
    "max_epochs": 1,
}


class LightningAdvCLI(LightningCLI):
    """LightningCLI for :class:`~lightning_adv.trainer.PPOModule` with parse-time validation."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--torch_num_threads", type=Optional[int], default=1,
            help="CPU threads torch may use (null: torch's default). The tiny default policy "
                 "runs fastest on one; more threads mostly wait on each other, badly so on a "
                 "busy machine.")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        threads = config.get("torch_num_threads")
        if threads is not None:
            if threads < 1:
                self.parser.error(f"torch_num_threads: expected null or a positive integer, "
                                  f"got {threads}")
            torch.set_num_threads(threads)
        model = config.get("model")
        values = model.as_dict() if hasattr(model, "as_dict") else dict(model or {})
        try:
            validate_model_config(values)
        except TaskError:
            raise  # what a task function returned (a prompt built early): exit 1, as in training
        except (ValueError, TypeError) as exc:
            self.parser.error(f"model.{exc}")


def main(args: ArgsType = None) -> None:
    """Run the CLI (``args``: a list of arguments instead of ``sys.argv``, or a config dict)."""
    # Batches are prompt indices: loader workers would not help.
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    # The post-update state is what a checkpoint of a finished PPO step should hold.
    warnings.filterwarnings("ignore", ".*Using ModelCheckpoint with manual optimization.*")
    # A Hugging Face policy's frozen reference stays in eval mode on purpose.
    warnings.filterwarnings("ignore", ".*module\\(s\\) in eval mode at the start of training.*")
    try:
        LightningAdvCLI(PPOModule, trainer_defaults=TRAINER_DEFAULTS,
                        auto_configure_optimizers=False, save_config_kwargs={"overwrite": True},
                        args=args, parser_kwargs={"prog": "python -m lightning_adv"})
    except TaskError as exc:
        # A task, reward or scorer function returned something unusable: the message names
        # the key, the function, the prompt and the sample; a traceback would add nothing.
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None

