"""Run hygiene of the CLI's runs: the saved config, Ctrl-C, the end-of-run summary.

- :class:`SaveRunConfig` saves the resolved config in the run directory and never
  overwrites a file (a name that is taken gets a number: ``config-2.yaml``);
- :class:`SampledTokenBudget` stops training at a budget of sampled tokens;
- :class:`TrainingStepCheckpoint` is Lightning's ``ModelCheckpoint`` counting training
  steps, the unit of every step count of the CLI and of the Ctrl-C checkpoint;
- :class:`InterruptCheckpoint` turns Ctrl-C during ``fit`` into "finish this training
  step, save a checkpoint, stop", so the run resumes exactly where it stopped;
- :class:`RunReport` prints the run's length and directory when training starts;
  :func:`fit_summary` is the few lines printed when ``fit`` ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, Timer
from lightning.pytorch.cli import SaveConfigCallback

from lightning_adv.trainer.run.output_filters import DropMessages


def free_path(directory: str, filename: str) -> Path:
    """``directory/filename``, or ``stem-2.ext``, ``stem-3.ext``... the first name not taken."""
    base = Path(directory) / filename
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.stem}-{n}{base.suffix}")
    return path


def next_version_dir(root: Path) -> Path:
    """``root/version_N`` with the first N not taken (TensorBoardLogger's naming)."""
    n = 0
    while (root / f"version_{n}").exists():
        n += 1
    return root / f"version_{n}"


#: run directories this process created (:class:`SaveRunConfig`), with the config it saved
CREATED_RUNS: list[tuple[Path, Path]] = []


def remove_runs_left_empty() -> None:
    """After a failed run: remove each run directory it created that holds nothing of a
    run (its own config.yaml and hparams.yaml, TensorBoard files without a step), so a
    run failing at step 0 leaves no empty ``version_N`` behind. A directory that existed
    before, or that holds a checkpoint, a logged step or any other file, is kept."""
    from lightning_adv.trainer.run.resume import last_logged_step

    while CREATED_RUNS:
        run, config = CREATED_RUNS.pop()
        files = [p for p in run.rglob("*") if not p.is_dir()]
        ours = all(p == config or p.parent == run and _logger_file(p) for p in files)
        if run.is_dir() and ours and last_logged_step(run) is None:
            shutil.rmtree(run)


def _logger_file(path: Path) -> bool:
    return path.name == "hparams.yaml" or path.name.startswith("events.out.tfevents.")


class SaveRunConfig(SaveConfigCallback):
    """Saves the run's resolved config as ``config.yaml`` in the run directory (the
    logger's ``log_dir``). An existing file is never overwritten: a resumed run continuing
    in its directory, or a directory holding a file of yours, gets ``config-2.yaml``...
    ``header``: comment lines written first (a resumed run's parent run and checkpoint)."""

    saved_path: Optional[Path] = None
    header: list[str] = []

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.already_saved:
            return
        log_dir = trainer.log_dir
        if trainer.is_global_zero and log_dir is not None:
            # This run's directory when it holds nothing yet but what the logger has just
            # opened (a resumed run continuing in place finds its config.yaml there).
            created = not any(p.is_dir() or not _logger_file(p) for p in Path(log_dir).glob("*"))
            os.makedirs(log_dir, exist_ok=True)
            text = "".join(f"{line}\n" for line in self.header)
            text += self.parser.dump(self.config, skip_none=False)
            while True:
                path = free_path(log_dir, self.config_filename)
                try:
                    with open(path, "x") as f:  # exclusive: a concurrent run cannot clobber it
                        f.write(text)
                    break
                except FileExistsError:
                    continue
            self.saved_path = path
            if created:
                CREATED_RUNS.append((Path(log_dir), path))
        self.already_saved = trainer.strategy.broadcast(True)


def training_steps(trainer: pl.Trainer, pl_module: Any) -> int:
    """Training steps (rollouts) done: the module's ``rollout_step``; Lightning's
    ``global_step`` counts optimizer steps (``ppo.epochs x ppo.minibatches`` per training
    step) and stands in for a module without one."""
    return int(getattr(pl_module, "rollout_step", trainer.global_step))


class SampledTokenBudget(Callback):
    """Stops training once the run's training steps have sampled ``max_tokens`` tokens
    (``train/sampled_tokens_total``: generated tokens, a tree's shared prefixes once,
    ``ppo.vine``'s continuations included), after the step that reaches it: runs of
    different samplers compared at an equal generated-token budget. The count is global
    over ranks and kept in checkpoints, so a resumed run stops where the whole run would.

    It counts the episodes a step trains on: the groups ``ppo.dynamic_sampling`` drops,
    ``ppo.greedy_baseline``'s greedy responses and held-out evaluation are not counted,
    and with ``ppo.off_policy_steps`` a step counts the (older) rollout it trains on."""

    def __init__(self, max_tokens: int):
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"SampledTokenBudget.max_tokens: expected a positive integer "
                             f"(tokens), got {max_tokens!r}")
        self.max_tokens = max_tokens

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if int(getattr(pl_module, "sampled_tokens", 0)) >= self.max_tokens:
            trainer.should_stop = True


class TrainingStepCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` in training steps: ``every_n_train_steps`` counts
    training steps (rollouts) and ``{step}`` in file names is the training step, as in
    ``interrupted-step=N.ckpt`` and the TensorBoard steps, so one folder speaks one unit
    (Lightning's own count optimizer steps, of which a PPO step takes several). The CLI
    uses it for every ``ModelCheckpoint`` of a config."""

    _stopped = False
    """Ctrl-C was handled: nothing more is saved (at the epoch's or the run's end a save
    would count the cut-short epoch as done, and resume after it)"""

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        self._save_every_n(trainer, pl_module)
        if interrupted(trainer) and not self._stopped:
            # last.ckpt now, mid-epoch like interrupted-step=N.ckpt (Lightning runs the
            # checkpoint callbacks after the others), so it resumes the rest of the epoch.
            if self._last_global_step_saved != trainer.global_step:
                self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
            self._stopped = True

    def _should_skip_saving_checkpoint(self, trainer: pl.Trainer) -> bool:
        return self._stopped or super()._should_skip_saving_checkpoint(trainer)

    def _save_every_n(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        every = self._every_n_train_steps
        if every < 1 or training_steps(trainer, pl_module) % every:
            return
        if self._should_skip_saving_checkpoint(trainer):
            return
        candidates = self._monitor_candidates(trainer)
        if self.monitor is not None and self.monitor not in candidates:
            self._defer_save_until_validation = True  # saved when validation has logged it
            return
        self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning keeps last.ckpt at the last periodic save: a run of 5 steps saving
        # every 2 would end with last.ckpt at step 4 and its fifth step in no file.
        if self._stopped:
            return
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
            return
        super().on_train_end(trainer, pl_module)

    def _monitor_candidates(self, trainer: pl.Trainer) -> dict[str, Any]:
        candidates = super()._monitor_candidates(trainer)
        candidates["step"] = torch.tensor(training_steps(trainer, trainer.lightning_module))
        return candidates


def interrupted(trainer: pl.Trainer) -> Optional[str]:
    """The Ctrl-C checkpoint of this fit (:class:`InterruptCheckpoint`), once saved."""
    return next((c.saved for c in trainer.callbacks
                 if isinstance(c, InterruptCheckpoint) and c.saved), None)


def checkpoint_dir(trainer: pl.Trainer) -> Optional[str]:
    """Where this run's checkpoints go: the ModelCheckpoint's directory, else
    ``<run dir>/checkpoints``."""
    callback = trainer.checkpoint_callback
    if isinstance(callback, ModelCheckpoint) and callback.dirpath:
        return str(callback.dirpath)
    return os.path.join(trainer.log_dir or trainer.default_root_dir, "checkpoints")


class InterruptCheckpoint(Callback):
    """Ctrl-C during ``fit``: the current training step finishes, a checkpoint is saved
    (``interrupted-step=N.ckpt`` beside the others), and training stops. A second Ctrl-C
    stops at once, without a checkpoint (Lightning's own shutdown). Every rank stops
    after the same step (the request is all-reduced after each step)."""

    def __init__(self) -> None:
        self.requested = False
        self.saved: Optional[str] = None
        self._previous: Any = None
        # After Ctrl-C, Lightning's "`Trainer.fit` stopped: `max_epochs=1` reached." is
        # untrue (the run was interrupted); the summary says what happened.
        self._quiet = DropMessages(("`Trainer.fit` stopped",))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.requested:
            self._restore()
            raise KeyboardInterrupt
        self.requested = True
        print("\nCtrl-C: finishing the current training step, then saving a checkpoint "
              "(Ctrl-C again to stop at once, without one)", file=sys.stderr, flush=True)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if not trainer.strategy.reduce_boolean_decision(self.requested, all=False):
            return
        step = training_steps(trainer, pl_module)
        path = os.path.join(checkpoint_dir(trainer), f"interrupted-step={step}.ckpt")
        trainer.save_checkpoint(path, weights_only=False)  # a full checkpoint, said so
        self.saved = path
        trainer.should_stop = True
        self._quiet.install()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        self._restore()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._quiet.remove()

    def _restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


class RunReport(Callback):
    """Prints, when training starts, how long the run is, where it writes, and that Ctrl-C
    saves a checkpoint (so a run is never a silent 3125-step epoch). ``steps_left``: the
    training steps a resumed run trains (:func:`~lightning_adv.trainer.run.resume.steps_left`,
    from the checkpoint's epoch and batch counters, as Lightning resumes)."""

    def __init__(self, steps_left: Optional[int] = None) -> None:
        self.steps_left = steps_left

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # trainer.log_dir broadcasts: every rank must ask for it.
        where = trainer.log_dir if trainer.logger is not None else checkpoint_dir(trainer)
        if not trainer.is_global_zero:
            return
        ppo = getattr(pl_module, "ppo_config", None)
        batch = f" of {ppo.prompts_per_step} prompts x {ppo.n_samples} samples" if ppo else ""
        done = getattr(pl_module, "rollout_step", 0)
        print(f"fit: {run_length(trainer, done, self.steps_left, batch)}; writing to {where}; "
              f"Ctrl-C saves a checkpoint and stops", flush=True)


def run_length(trainer: pl.Trainer, done: int, steps_left: Optional[int], batch: str = "") -> str:
    """How many training steps (of ``batch``) this fit runs, as the banner says it."""
    bounds = []
    if trainer.max_steps not in (None, -1):
        bounds.append(f"trainer.max_steps={trainer.max_steps} optimizer steps")
    if any(isinstance(c, Timer) for c in trainer.callbacks):
        bounds.append("trainer.max_time")
    bounds += [f"{c.max_tokens} sampled tokens" for c in trainer.callbacks
               if isinstance(c, SampledTokenBudget)]
    if trainer.max_epochs in (None, -1):  # (the CLI refuses -1 that nothing bounds)
        return f"training steps{batch} until {' or '.join(bounds)}"
    limit = " (or " + " or ".join(bounds) + ", if first)" if bounds else ""
    if done and steps_left is not None:
        return (f"{steps_left} more training steps{batch}, resuming after step {done} (to step "
                f"{done + steps_left}: trainer.max_epochs={trainer.max_epochs}){limit}")
    total = int(trainer.num_training_batches) * trainer.max_epochs
    start = f", resuming after step {done}" if done else ""
    return f"{total} training steps{batch} (trainer.limit_train_batches x max_epochs){limit}{start}"


def resume_command(config: Optional[Path], ckpt: str) -> str:
    parts = ["python -m lightning_adv fit"]
    if config is not None:
        parts.append(f"--config {config}")
    parts.append(f"--ckpt_path {ckpt}")
    return " ".join(parts)


def fit_summary(trainer: pl.Trainer, module: Any, log_dir: Optional[str]) -> list[str]:
    """The lines printed when ``fit`` ends: steps, final reward, where the outputs are
    (``log_dir``: ``trainer.log_dir``, which every rank must have asked for)."""
    steps = training_steps(trainer, module)
    lines = [f"fit: {steps} training steps ({trainer.global_step} optimizer steps)"]
    rewards = list(getattr(module, "reward_history", []))
    if rewards:
        last = rewards[-10:]
        lines.append(f"  final train/task_reward {rewards[-1]:.3f} (mean of the last "
                     f"{len(last)} steps: {sum(last) / len(last):.3f})")
    shown = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    if shown:
        lines.append("  last validation: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(shown.items())))
    if trainer.logger is not None and log_dir:
        lines.append(f"  logs: {log_dir} (tensorboard --logdir {Path(log_dir).parent.parent})")
    else:
        lines.append("  logs: none (trainer.logger is off)")
    callback = trainer.checkpoint_callback
    if isinstance(callback, ModelCheckpoint) and callback.dirpath:
        # After Ctrl-C the checkpoint to resume is the interrupted one (last.ckpt holds the
        # same state when the config saves one).
        latest = interrupted(trainer) or callback.last_model_path or callback.best_model_path
        lines.append(f"  checkpoints: {callback.dirpath}" + (f" (latest: {Path(latest).name})" if latest else ""))
    else:
        lines.append("  checkpoints: none (trainer.enable_checkpointing is off)")
    return lines


def close_process_group() -> None:
    """Destroy the DDP process group Lightning leaves open after a run. Otherwise gloo's
    threads are still joinable when the interpreter exits, and a run that finished cleanly
    can abort there ("terminate called without an active exception", SIGABRT, exit -6)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
