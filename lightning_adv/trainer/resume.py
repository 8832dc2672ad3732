"""Resuming a run from a checkpoint: the config you give wins, the checkpoint gives state.

A resumed run is configured by its command line and YAML alone (never by the
hyper-parameters stored in the checkpoint): the checkpoint contributes what was trained
(weights, optimizer moments, the step counter, the loader position, the KL controller)
and nothing else. :func:`config_differences` lists the settings that changed, so the
CLI can say so; :func:`reconcile_checkpoint` makes a checkpoint fit the module built
from the new settings where that is well defined, and refuses with the differing keys
where it is not (a different network).
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
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


def describe(differences: list[tuple[str, Any, Any]], prefix: str = "model.") -> str:
    return ", ".join(f"{prefix}{key} ({old!r} in the checkpoint, {new!r} now)"
                     for key, old, new in differences)


#: the file of a sharded checkpoint directory (``--trainer.strategy=fsdp2``) that holds
#: everything but the weights and optimizer states (Lightning's name for it)
SHARDED_METADATA = "meta.pt"


def load_checkpoint_info(path: str) -> dict[str, Any]:
    """``{"hparams": ..., "step": ...}`` of a Lightning checkpoint (a file, or the
    directory of a sharded one): its stored hyper-parameters and the training steps it
    holds (memory-mapped, on CPU)."""
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
    return {"hparams": hparams, "step": int(state.get("rollout_step", checkpoint.get("global_step", 0)))}


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
    """
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
