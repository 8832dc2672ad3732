"""The LightningCLI of the trainer: ``python -m lightning_adv fit --config configs/ppo.yaml``.

Besides LightningCLI's ``fit``, ``validate``, ``test`` and ``predict``, the commands of
:data:`EXTRA_COMMANDS` (``make-tiny``, ``report``) are dispatched before LightningCLI parses anything;
each parses its own arguments (``python -m lightning_adv make-tiny --help``).

jsonargparse checks types (and ``Literal`` choices) while parsing; right after it, before
anything runs, :meth:`LightningAdvCLI.check_config` builds the model's
config dataclasses, the task, the process scorers and the ``AdvantageModule`` (which
resolves every stage path), so a wrong stage name, a bad kwarg or an unimportable path
is a usage error (exit 2) that names the key, before any model or logger exists. A usage
error prints ``error: <what>`` first, then one line pointing at ``--help`` (which shows
every field's description), not the whole usage.

Run hygiene (docs/guides/cli-trainer.md): a resumed run is configured by its command line, never
by the checkpoint's stored settings (:mod:`lightning_adv.trainer.run.resume`); it continues
in the checkpoint's run directory only when that replaces nothing there, else in a new
``version_N`` (:mod:`lightning_adv.trainer.run.run_dirs`); evaluations write under the
run's ``eval/``; the resolved config is saved without overwriting anything; Ctrl-C saves
a checkpoint and prints the resume command; ``fit`` ends with a short summary. Failures
are one ``error:`` line: exit 2 for a usage error, 1 for a failure during training.
"""

from __future__ import annotations

import copy
import importlib
import sys
import warnings
from pathlib import Path
from typing import Any, NoReturn, Optional

import jsonargparse
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI

from lightning_adv.exceptions import (
    AdvantageContractError, CheckpointMismatchError, NonFiniteTrainingError, PeerRankFailed,
    TaskError)
from lightning_adv.trainer.run.callbacks import (
    InterruptCheckpoint, RunReport, SaveRunConfig, TrainingStepCheckpoint, fit_summary,
    close_process_group, next_version_dir, remove_runs_left_empty, resume_command)
from lightning_adv.trainer.logs.evaluation import PredictionWriter
from lightning_adv.trainer.run.output_filters import quiet_dependency_noise
from lightning_adv.trainer.ppo import PPOModule
from lightning_adv.trainer.run.resume import (
    ResumeTarget, changed_settings, describe, load_checkpoint_info, nothing_left_to_train,
    resume_target, steps_left)
from lightning_adv.trainer.run.run_dirs import (
    EVALUATION_COMMANDS, continue_in, logger_dir, new_version, parent_lines, place_evaluation)
from lightning_adv.trainer.setup import SECTIONS, TrainerPlan, world_size_of
from lightning_adv.trainer.run.cli_args import (
    STEP_COUNT_KEYS, as_step_count, config_file_error, null_section_error, stage_shorthands,
    steps_per_epoch, trainer_errors, use_training_step_checkpoints)

#: training steps per epoch of a run on a drawn task that sets no length (the shipped
#: configs' length); an epoch of the default prompt pool would be 3125 steps
DEFAULT_TRAINING_STEPS = 300

TRAINER_DEFAULTS: dict[str, Any] = {
    "logger": {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": "runs", "name": "lightning_adv", "default_hp_metric": False},
    },
    "log_every_n_steps": 1,
    "max_epochs": 1,
    "num_sanity_val_steps": 0,
}

#: where a run without a logger keeps its config and checkpoints (a fresh version each run)
UNLOGGED_RUNS = Path("runs") / "no_logger"

#: Lightning's special ``ckpt_path`` values (not files)
SPECIAL_CKPT_PATHS = ("last", "best", "hpc")

#: ``python -m lightning_adv <command> ...`` besides fit / validate / test / predict: the
#: command's name -> ("module:function" called with the arguments after the name, which it
#: parses itself, --help included; what it does, for the main --help)
EXTRA_COMMANDS: dict[str, tuple[str, str]] = {
    "make-tiny": ("lightning_adv.trainer.policies.hf.make_tiny:main",
                  "write a tiny random Hugging Face causal LM and its tokenizer"),
    "report": ("lightning_adv.visualize.report:main",
               "write one self-contained HTML page of a run directory: config, curves, "
               "evaluation, advantage heatmaps"),
}

# --help shows each config field's docstring (the string literal under it).
jsonargparse.set_parsing_settings(docstring_parse_attribute_docstrings=True)


class ConciseParser(LightningArgumentParser):
    """A usage error prints ``error: <message>`` first and a pointer to ``--help``, not the
    whole usage (over a hundred lines with the trainer's options). Abbreviated options
    are refused: ``--model.ppo.n_sample`` is a typo, not ``n_samples``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Optional[Exception] = None) -> NoReturn:
        if not self.exit_on_error:
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        prog = parser.prog.replace(" [options]", "")
        lines = [line.strip() for line in message.strip().splitlines()]
        if len(lines) > 1 and lines[0].endswith(":"):  # jsonargparse: 'Parser key "x":' then why
            lines[:2] = [f"{lines[0]} {lines[1]}"]
        sys.stderr.write(f"error: {lines[0]}\n" + "".join(f"  {line}\n" for line in lines[1:8]))
        sys.stderr.write(f"({prog} --help lists every option with its description)\n")
        self.exit(2)


class LightningAdvCLI(LightningCLI):
    """LightningCLI for :class:`~lightning_adv.trainer.PPOModule` with parse-time validation."""

    checkpoint_info: Optional[dict[str, Any]] = None
    _argv: list[str] = []
    resume: Optional[ResumeTarget] = None
    steps_left: Optional[int] = None
    parent_lines: list[str] = []

    def _usage_error(self, message: str) -> NoReturn:
        self._parser(self.config.get("subcommand")).error(message)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--torch_num_threads", type=Optional[int], default=1,
            help="CPU threads torch may use (null: torch's default). The tiny default policy "
                 "runs fastest on one; more threads mostly wait on each other, badly so on a "
                 "busy machine.")
        parser.add_argument(
            "--overwrite_run", type=bool, default=False,
            help="fit with --ckpt_path: continue in the checkpoint's run directory even when "
                 "that replaces its later checkpoints and TensorBoard steps, or the run's "
                 "settings changed (default false: such a resume starts the next version_N "
                 "and leaves the run it resumes as it was)")

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        if isinstance(args, dict):
            self.config = parser.parse_object(args)
        else:
            argv = list(sys.argv[1:] if args is None else args)
            error = config_file_error(argv)
            if error is not None:
                parser.error(error)
            self.config = parser.parse_args(stage_shorthands(argv))
            self._argv = argv
        self.check_config()

    def _parse_ckpt_path(self) -> None:
        """LightningCLI would re-parse the checkpoint's hyper-parameters over the command
        line, silently undoing overrides; here the command line wins (guides/cli-trainer.md, "Runs"),
        and :meth:`check_config` has read the checkpoint."""

    def check_config(self) -> None:
        """Every usage check, right after parsing and before anything else runs or prints:
        a bad value is ``error: <key>: ...`` and exit 2; warnings about the config are shown
        only when it is valid."""
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        threads = config.get("torch_num_threads")
        if threads is not None and threads < 1:
            self._usage_error(f"torch_num_threads: expected null or a positive integer, got {threads}")
        trainer = config.trainer
        for key in STEP_COUNT_KEYS:  # as saved in the run's config (the trainer gets them below)
            trainer[key] = as_step_count(trainer.get(key))
        error = trainer_errors(trainer, subcommand)
        if error:
            self._usage_error(error)
        use_training_step_checkpoints(trainer)
        if config.get("ckpt_path") is not None:
            self._read_checkpoint(config)
        plan = self._check_model(config.get("model"), trainer)
        if (trainer.get("limit_train_batches") is None and trainer.get("max_steps", -1) == -1
                and trainer.get("max_time") is None and plan.task.dataset is None):
            # A drawn task's epoch is as long as its pool (3125 steps by default): a run that
            # sets no length runs the shipped configs' 300 steps (a dataset: one pass per epoch).
            trainer.limit_train_batches = DEFAULT_TRAINING_STEPS
        steps = steps_per_epoch(trainer, plan.runtime.num_prompts, plan.ppo.prompts_per_step)
        if subcommand == "fit" and steps == 0:
            self._usage_error(f"trainer.limit_train_batches: {trainer.limit_train_batches} of an "
                              f"epoch of {plan.runtime.num_prompts // plan.ppo.prompts_per_step} "
                              f"steps is 0 steps, so fit would train nothing")
        self._check_validation_schedule(plan, trainer, steps)
        if self.checkpoint_info is not None:
            changed = changed_settings(self.checkpoint_info, plan.hparams,
                                       config.get("seed_everything"))
            if subcommand == "fit":
                self._plan_resume(config, changed, steps)
            elif changed:
                print(f"note: the checkpoint was trained with other settings; this {subcommand} "
                      f"uses the command line's: {describe(changed)}", file=sys.stderr)

    def _check_model(self, model: Any, trainer: Any) -> TrainerPlan:
        values = model.as_dict() if hasattr(model, "as_dict") else dict(model or {})
        error = null_section_error(values, SECTIONS, self._argv)
        if error:
            self._usage_error(error)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                plan = TrainerPlan.build(values, world_size_of(trainer.as_dict()))
            except TaskError:
                raise  # what a task function returned (a prompt built early): exit 1, as in training
            except (ValueError, TypeError) as exc:
                self._usage_error(f"model.{exc}")
        plan.keep_for_module(values)  # the module takes it: the plan is built once per run
        for warning in caught:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        return plan

    def _check_validation_schedule(self, plan: TrainerPlan, trainer: Any, steps: int) -> None:
        interval = trainer.get("val_check_interval")
        if interval is None:
            return
        if not plan.evaluation.num_prompts or trainer.get("limit_val_batches") == 0:
            warnings.warn("trainer.val_check_interval: validation is off (model.evaluation."
                          "num_prompts or trainer.limit_val_batches is 0), so it is ignored",
                          stacklevel=2)
            return
        if isinstance(interval, int) and interval > steps:
            self._usage_error(f"trainer.val_check_interval: validation runs every this many "
                              f"training steps within an epoch of {steps} steps, got {interval}")

    def _read_checkpoint(self, config: Any) -> None:
        path = config.ckpt_path
        if path in SPECIAL_CKPT_PATHS:
            return
        if not Path(path).exists():  # (a sharded checkpoint is a directory)
            self._usage_error(f"ckpt_path: no such checkpoint file {path!r}")
        try:
            self.checkpoint_info = load_checkpoint_info(path)
        except Exception as exc:  # noqa: BLE001 -- any unreadable file is the same usage error
            reason = str(exc).split("\n")[0][:120]
            self._usage_error(f"ckpt_path: {path!r} is not a Lightning checkpoint (torch.load "
                              f"could not read it: {type(exc).__name__}: {reason})")
        # The saved config resumes from any working directory.
        config.ckpt_path = str(Path(path).resolve())

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if config.get("torch_num_threads") is not None:
            torch.set_num_threads(config.torch_num_threads)

    def _plan_resume(self, config: Any, changed: list[tuple[str, Any, Any]], steps: int) -> None:
        """Refuse a resume with nothing left to train; choose where the resumed run writes."""
        trainer, info = config.trainer, self.checkpoint_info
        finished = nothing_left_to_train(info, trainer.get("max_epochs"),
                                         trainer.get("max_steps", -1), steps)
        if finished:
            self._usage_error(f"ckpt_path: {finished}")
        if trainer.get("max_epochs") not in (None, -1):
            self.steps_left = steps_left(info, trainer.max_epochs, steps)
        if changed:
            print(f"note: resuming with settings that differ from the checkpoint's; this run "
                  f"uses the command line's: {describe(changed)}", file=sys.stderr)
        self.resume = resume_target(config.ckpt_path, info["step"], changed, logger_dir(trainer),
                                    bool(config.get("overwrite_run")))
        self.parent_lines = parent_lines(self.resume, config.ckpt_path, info, changed)
        parent = self.resume.parent
        if self.resume.in_place and self.resume.replaced:
            print(f"note: --overwrite_run: continuing in {parent}, replacing "
                  f"{'; '.join(self.resume.replaced)}", file=sys.stderr)
        elif self.resume.reasons:
            print(f"note: {parent} is left as it is ({'; '.join(self.resume.reasons)}); this "
                  f"run writes to a new run directory whose config.yaml names its parent "
                  f"(--overwrite_run=true would continue in {parent.name}, replacing those)",
                  file=sys.stderr)

    def instantiate_classes(self) -> None:
        # The saved config is what the user gave; where the outputs go is decided here,
        # on a copy: a fresh run directory without a logger, the checkpoint's run
        # directory or a new version_N when resuming, eval/ for an evaluation.
        saved = self.config
        self.config = copy.deepcopy(saved)
        config = self.config[self.subcommand] if self.subcommand else self.config
        trainer = config.trainer
        if self.subcommand in EVALUATION_COMMANDS:
            place_evaluation(config, self.subcommand, UNLOGGED_RUNS)
            # An evaluation restores weights only: the training callbacks' state is moot.
            warnings.filterwarnings("ignore", ".*callbacks used to create the checkpoint need to be")
        elif not trainer.get("logger") and trainer.get("default_root_dir") is None:
            trainer.default_root_dir = str(next_version_dir(UNLOGGED_RUNS))
        elif self.resume is not None and self.resume.in_place:
            continue_in(trainer, self.resume.parent, self.checkpoint_info["step"])
            warnings.filterwarnings("ignore", "Checkpoint directory .* exists and is not empty")
        elif self.resume is not None:
            new_version(trainer)  # (Lightning's "dirpath has changed" note: output_filters)
        try:
            super().instantiate_classes()
        except ValueError as exc:
            # A config the pre-flight check cannot see without the weights (a LoRA
            # target that matches no module): its message names the key.
            self._usage_error(f"model.{exc}")
        finally:
            self.config = saved
        saver = next((c for c in self.trainer.callbacks if isinstance(c, SaveRunConfig)), None)
        if saver is not None:
            saver.header = list(self.parent_lines)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Any:
        # Here, after jsonargparse's last pass over the values (instantiation adapts
        # ``int | float`` again).
        for key in STEP_COUNT_KEYS:
            if key in config:
                config[key] = as_step_count(config[key])
        if self.subcommand == "fit":
            extra = [InterruptCheckpoint(), RunReport(self.steps_left)]
            configured = config.get("callbacks") or []
            configured = [*(configured if isinstance(configured, list) else [configured]), *callbacks]
            if config.get("enable_checkpointing") is not False and not any(
                    isinstance(c, ModelCheckpoint) for c in configured):
                extra.append(TrainingStepCheckpoint())  # Lightning's default counts optimizer steps
            callbacks = [*callbacks, *extra]
        elif self.subcommand == "predict":
            callbacks = [*callbacks, PredictionWriter()]
        try:
            return super()._instantiate_trainer(config, callbacks)
        except ValueError as exc:  # Lightning's (a strategy the accelerator cannot run)
            self._usage_error(f"trainer: {exc}")

    def after_fit(self) -> None:
        trainer = self.trainer
        log_dir = trainer.log_dir  # a collective: every rank asks
        if not trainer.is_global_zero:
            return
        lines = fit_summary(trainer, self.model, log_dir)
        if self.resume is not None and self.resume.in_place:
            lines.insert(1, f"  resumed in {self.resume.parent}")
        elif self.resume is not None and self.resume.parent is not None:
            lines.insert(1, f"  resumed at step {self.checkpoint_info['step']} of "
                            f"{self.resume.parent} (left as it was) in a new run directory")
        interrupt = next((c for c in trainer.callbacks if isinstance(c, InterruptCheckpoint)), None)
        saver = next((c for c in trainer.callbacks if isinstance(c, SaveRunConfig)), None)
        config = saver.saved_path if saver is not None else None
        if interrupt is not None and interrupt.saved:
            lines.append(f"  interrupted; checkpoint saved: {interrupt.saved}")
            lines.append(f"  resume with: {resume_command(config, interrupt.saved)}")
        print("\n".join(lines), flush=True)
        if interrupt is not None and interrupt.saved:
            raise SystemExit(130)


    def after_predict(self) -> None:
        writer = next(c for c in self.trainer.callbacks if isinstance(c, PredictionWriter))
        if self.trainer.is_global_zero:
            print(f"predict: {writer.lines} responses (prompt, response, reward) written to "
                  f"{writer.written}", flush=True)


def run_extra_command(name: str, args: list[str]) -> None:
    """Run the command ``name`` of :data:`EXTRA_COMMANDS` with its arguments ``args``."""
    module, function = EXTRA_COMMANDS[name][0].split(":")
    getattr(importlib.import_module(module), function)(args)


def extra_commands_help() -> str:
    """The main ``--help``'s list of :data:`EXTRA_COMMANDS`."""
    return "other commands: " + "; ".join(
        f"{name} ({what}; {name} --help)" for name, (_, what) in EXTRA_COMMANDS.items())


def main(args: ArgsType = None) -> None:
    """Run the CLI (``args``: a list of arguments instead of ``sys.argv``, or a config dict)."""
    argv = sys.argv[1:] if args is None else args
    if isinstance(argv, (list, tuple)) and argv and argv[0] in EXTRA_COMMANDS:
        run_extra_command(argv[0], list(argv[1:]))
        return
    quiet_dependency_noise()
    finished = False
    try:
        LightningAdvCLI(PPOModule, trainer_defaults=TRAINER_DEFAULTS,
                        auto_configure_optimizers=False, save_config_callback=SaveRunConfig,
                        parser_class=ConciseParser, args=args,
                        parser_kwargs={"prog": "python -m lightning_adv",
                                       "epilog": extra_commands_help()})
        finished = True
    except (TaskError, AdvantageContractError, NonFiniteTrainingError, PeerRankFailed) as exc:
        # A task, reward or scorer function returned something unusable, a user stage broke
        # its contract, a step went non-finite (or another rank failed): the message names
        # the key or stage or step, what was expected and what was given; a traceback would
        # add nothing.
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except CheckpointMismatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    finally:
        close_process_group()
        if not finished:  # (after Lightning's teardown: the logger has written its last file)
            remove_runs_left_empty()
