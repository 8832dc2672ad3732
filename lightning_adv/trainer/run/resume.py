"""Resuming a run from a checkpoint: the config you give wins, the checkpoint gives state.

A resumed run is configured by its command line and YAML alone (never by the
hyper-parameters stored in the checkpoint): the checkpoint contributes what was trained
(weights, optimizer moments, the step counter, the loader position, the KL controller)
and nothing else. :func:`config_differences` lists the settings that changed, so the
CLI can say so; :func:`reconcile_checkpoint` makes a checkpoint fit the module built
from the new settings where that is well defined, and refuses with the differing keys
where it is not (a different network).

Where a resumed run writes (:func:`resume_target`): nothing of the run it resumes is
replaced. It continues in the checkpoint's run directory only when that replaces
nothing there (the same settings, no checkpoint or TensorBoard step after the resumed
one: a run stopped by Ctrl-C or a crash); otherwise it starts the next ``version_N``,
whose saved config names its parent run and checkpoint. A run with nothing left to train
is refused (:func:`nothing_left_to_train`), its checkpoint untouched.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from lightning_adv.exceptions import CheckpointMismatchError

#: sections of the module's hyper-parameters that shape the network's weights
SHAPE_SECTIONS = ("policy", "task")


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and scalars are leaves."""
    if not isinstance(tree, Mapping) or (prefix and not tree):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any]
                       ) -> list[tuple[str, Any, Any]]:
    """``(key, checkpoint value, current value)`` for every setting that differs."""
    old, new = flatten(saved), flatten(current)
    missing = object()
    keys = sorted(set(old) | set(new))
    return [(k, old.get(k), new.get(k)) for k in keys
            if old.get(k, missing) != new.get(k, missing)]


def changed_settings(info: Mapping[str, Any], hparams: Mapping[str, Any],
                     seed_everything: Any = None) -> list[tuple[str, Any, Any]]:
    """The settings of ``hparams`` that differ from those of the checkpoint ``info``
    (:func:`load_checkpoint_info`), the seed included: the module's own
    (``model.seed``) or else the run's ``seed_everything``."""
    saved, current = dict(info["hparams"]), dict(hparams)
    saved.pop("seed", None)
    seed = current.pop("seed", None)
    seed = seed if seed is not None else seed_everything
    changed = config_differences(saved, current)
    old_seed = info.get("seed")
    if (isinstance(seed, int) and not isinstance(seed, bool) and old_seed is not None
            and int(old_seed) != seed):
        changed.append(("seed", int(old_seed), seed))
    return changed


def describe(differences: list[tuple[str, Any, Any]], prefix: str = "model.") -> str:
    return ", ".join(f"{prefix}{key} ({old!r} in the checkpoint, {new!r} now)"
                     for key, old, new in differences)


#: the file of a sharded checkpoint directory (``--trainer.strategy=fsdp2``) that holds
#: everything but the weights and optimizer states (Lightning's name for it)
SHARDED_METADATA = "meta.pt"


def load_checkpoint_info(path: str | Path) -> dict[str, Any]:
    """What the CLI reads of a Lightning checkpoint (a file, or the directory of a sharded
    one; memory-mapped, on CPU): its stored ``hparams``, the training steps it holds
    (``step``), its ``seed``, Lightning's ``global_step`` (optimizer steps) and the
    training epochs it completed (``epochs_done``)."""
    if Path(path).is_dir():
        if not (Path(path) / SHARDED_METADATA).is_file():
            raise ValueError(f"a directory without {SHARDED_METADATA}, so not a sharded checkpoint")
        path = str(Path(path) / SHARDED_METADATA)
    if not zipfile.is_zipfile(path):
        raise ValueError("not a torch.save archive")
    checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    hparams = dict(checkpoint.get("hyper_parameters", {}) or {})
    hparams.pop("_instantiator", None)
    state = checkpoint.get("lightning_adv", {}) or {}
    global_step = int(checkpoint.get("global_step", 0))
    fit_loop = (checkpoint.get("loops") or {}).get("fit_loop") or {}
    epochs = (fit_loop.get("epoch_progress") or {}).get("current") or {}
    batches = (fit_loop.get("epoch_loop.batch_progress") or {}).get("current") or {}
    # Lightning counts an epoch as processed before the hook that saves its last checkpoint.
    epochs_done = int(epochs.get("processed", checkpoint.get("epoch", 0)))
    return {"hparams": hparams, "step": int(state.get("rollout_step", global_step)),
            "seed": state.get("seed"), "global_step": global_step, "epochs_done": epochs_done,
            "mid_epoch": int(epochs.get("started", epochs_done)) > epochs_done,
            "steps_in_epoch": int(batches.get("processed", 0))}


def steps_left(info: Mapping[str, Any], max_epochs: int, steps_per_epoch: int) -> int:
    """The training steps Lightning's fit loop runs when it resumes the checkpoint of
    ``info`` (:func:`load_checkpoint_info`) for ``max_epochs`` epochs of ``steps_per_epoch``
    steps (trainer.max_steps aside). It goes by the checkpoint's own epoch and batch
    counters, not by its step count: the epochs it counts as done are done, whatever
    their length; a checkpoint saved within an epoch finishes that epoch first (or runs
    it anew when it already holds ``steps_per_epoch`` of its steps: Lightning's restart
    of an epoch saved at its end)."""
    epochs = max_epochs - info["epochs_done"]
    if epochs <= 0:
        return 0
    left = epochs * steps_per_epoch
    if info.get("mid_epoch") and 0 < info.get("steps_in_epoch", 0) < steps_per_epoch:
        left -= info["steps_in_epoch"]
    return left


def nothing_left_to_train(info: Mapping[str, Any], max_epochs: Optional[int], max_steps: int,
                          steps_per_epoch: int) -> Optional[str]:
    """Why resuming the checkpoint of ``info`` (:func:`load_checkpoint_info`) would train
    nothing under this trainer config, and how to train on; None when steps are left.
    ``steps_per_epoch``: training steps per epoch of this config."""
    if max_steps not in (None, -1) and info["global_step"] >= max_steps:
        return (f"nothing is left to train: the checkpoint holds {info['global_step']} optimizer "
                f"steps and trainer.max_steps is {max_steps}; to train on, raise "
                f"--trainer.max_steps (it counts optimizer steps). The checkpoint is left as it is")
    if max_epochs in (None, -1) or steps_left(info, max_epochs, steps_per_epoch) > 0:
        return None
    return (f"nothing is left to train: the checkpoint holds {info['step']} training steps in "
            f"{info['epochs_done']} finished epoch(s), and this config trains "
            f"trainer.max_epochs={max_epochs} epoch(s) of {steps_per_epoch} steps (a resumed run "
            f"goes on after the checkpoint's finished epochs); to train on, raise "
            f"--trainer.max_epochs (each more epoch trains trainer.limit_train_batches steps). "
            f"The checkpoint is left as it is")


def run_dir_of(ckpt_path: str) -> Optional[Path]:
    """The run directory a checkpoint was written into (``<run>/checkpoints/x.ckpt``), when
    it looks like one (its parent is ``checkpoints`` and the run saved its config)."""
    path = Path(ckpt_path).resolve()
    run = path.parent.parent
    if path.parent.name == "checkpoints" and any(run.glob("config*.yaml")):
        return run
    return None


def reconcile_checkpoint(checkpoint: dict[str, Any], own_state: Mapping[str, torch.Tensor],
                         hparams: Mapping[str, Any]) -> None:
    """Make ``checkpoint["state_dict"]`` loadable into a module whose ``state_dict`` is
    ``own_state`` and whose hyper-parameters are ``hparams`` (modified in place: it is the
    checkpoint Lightning is about to load).

    - The frozen reference policy is the initial policy, rebuilt from the seed: when the
      checkpoint has none (it ran without a KL term) the module's own is kept; when this
      run needs none, the checkpoint's is dropped.
    - The KL coefficient follows the config: a fixed controller takes ``actor.kl_ctl``; an
      adaptive one keeps its trained value unless ``actor.kl_ctl`` (its start) changed.
    - Any other difference in the weights is refused, naming the settings that differ.

    A sharded checkpoint (``--trainer.strategy=fsdp2``) has no ``state_dict``: its weights
    are loaded into the shards already, by the strategy, before this hook.
    """
    if "state_dict" not in checkpoint:
        return
    state = checkpoint.setdefault("state_dict", {})
    for key in [k for k in state if k.startswith("ref_policy.") and k not in own_state]:
        del state[key]
    for key, value in own_state.items():
        if key.startswith("ref_policy.") and key not in state:
            state[key] = value.detach().clone()
    saved = dict(checkpoint.get("hyper_parameters", {}) or {})
    coef = "kl_controller.kl_coef"
    if "kl_controller.coef" in state:  # the buffer's name in checkpoints of version 0.1
        state[coef] = state.pop("kl_controller.coef")
    if coef in own_state and coef in state:
        kl_type = (hparams.get("kl_controller") or {}).get("type", "fixed")
        old_start = (saved.get("actor") or {}).get("kl_ctl")
        new_start = (hparams.get("actor") or {}).get("kl_ctl")
        if kl_type == "fixed" or old_start != new_start:
            state[coef] = own_state[coef].detach().clone()
    mismatched = sorted(
        [k for k in own_state if k not in state]
        + [k for k in state if k not in own_state]
        + [k for k in own_state if k in state and tuple(own_state[k].shape) != tuple(state[k].shape)])
    if mismatched:
        changed = [d for d in config_differences(saved, hparams)
                   if d[0].split(".")[0] in SHAPE_SECTIONS or d[0] == "ppo.max_new_tokens"]
        because = (f"the network differs: {describe(changed)}" if changed else
                   "the checkpoint was written by a different network")
        shown = ", ".join(mismatched[:6]) + (", ..." if len(mismatched) > 6 else "")
        raise CheckpointMismatchError(
            f"ckpt_path: the checkpoint's weights do not fit this config ({because}); "
            f"mismatched weights: {shown}. Resume with the settings the checkpoint was "
            f"trained with (its run's config.yaml)")


# ---------------------------------------------------------------------- where a resumed run writes

def last_logged_step(run_dir: Path) -> Optional[int]:
    """The highest step of any TensorBoard summary in ``run_dir``'s own event files (its
    subdirectories are other runs: ``eval/``); None without any."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    steps = [event.step for path in sorted(run_dir.glob("events.out.tfevents.*"))
             for event in EventFileLoader(str(path)).Load() if event.HasField("summary")]
    return max(steps) if steps else None


def checkpoint_steps(directory: Path) -> dict[str, int]:
    """The training step of each readable checkpoint in ``directory``, by file name."""
    steps = {}
    for path in sorted(directory.glob("*.ckpt")):
        try:
            steps[path.name] = load_checkpoint_info(path)["step"]
        except Exception:  # noqa: BLE001 -- not a checkpoint of ours: nothing we would replace
            continue
    return steps


def replaced_by_continuing(run_dir: Path, step: int) -> list[str]:
    """What a run resumed at training step ``step`` would replace if it went on in
    ``run_dir``: checkpoints of later steps, a ``last.ckpt`` that is the only copy of its
    step, and TensorBoard events from ``step`` on (``purge_step``)."""
    found = []
    steps = checkpoint_steps(run_dir / "checkpoints")
    later = [name for name, s in steps.items() if s > step]
    if later:
        found.append(f"its checkpoints after step {step} ({', '.join(later)})")
    last = steps.get("last.ckpt")
    if last is not None and last <= step and not any(
            s == last for name, s in steps.items() if name != "last.ckpt"):
        found.append(f"last.ckpt, the only checkpoint of step {last}")
    logged = last_logged_step(run_dir)
    if logged is not None and logged >= step:
        found.append(f"its TensorBoard steps {step}-{logged}")
    return found


@dataclass
class ResumeTarget:
    """Where a resumed ``fit`` writes (:func:`resume_target`)."""

    in_place: bool
    """continue in ``parent`` (TensorBoard purges from the step; checkpoints keep their names)"""
    parent: Optional[Path]
    """the checkpoint's run directory (None: the checkpoint lies outside a run directory)"""
    reasons: list[str] = field(default_factory=list)
    """why not in place: the settings that differ, what continuing would replace"""
    replaced: list[str] = field(default_factory=list)
    """what continuing in ``parent`` replaces (only with the explicit overwrite flag)"""


def resume_target(ckpt: str, step: int, changed: list[tuple[str, Any, Any]],
                  logger_dir: Optional[Path], overwrite: bool) -> ResumeTarget:
    """Continue in the checkpoint's run directory, or start a new one. ``changed``: the
    settings that differ from the checkpoint's (:func:`config_differences`);
    ``logger_dir``: the TensorBoard logger's ``save_dir/name`` (None: no TensorBoard
    logger, so a new directory anyway); ``overwrite``: continue in place whatever that
    replaces (the user's explicit flag)."""
    parent = run_dir_of(ckpt)
    if parent is None or logger_dir is None or logger_dir.resolve() != parent.parent:
        return ResumeTarget(False, parent)
    replaced = replaced_by_continuing(parent, step)
    if overwrite:
        return ResumeTarget(True, parent, replaced=replaced)
    reasons = ([f"its settings differ: {describe(changed)}"] if changed else []) + replaced
    return ResumeTarget(not reasons, parent, reasons=reasons)
