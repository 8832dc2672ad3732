"""Module paths of the trainer before it was split into sub-packages (0.3), still
importable for one release: ``import lightning_adv.trainer.policy`` gives the module now at
``lightning_adv.trainer.policies.tiny_network``, with a ``DeprecationWarning`` naming it.

A meta path finder rather than a stub file per old name, so the old names leave no files
in the package (``tasks`` and ``rollout`` are sub-packages under their old names: nothing
to alias).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any, Optional, Sequence

#: old module name (under ``lightning_adv.trainer``) -> its new one
MOVED = {
    "policy": "policies.tiny_network",
    "policy_config": "policies.config",
    "hf_policy": "policies.hf.policy",
    "hf_loading": "policies.hf.loading",
    "hf_tokenizer": "policies.hf.tokenizer",
    "hf_sampling": "policies.hf.sampling",
    "prompt_sharing": "policies.hf.prompt_sharing",
    "tiny_hf_model": "policies.hf.make_tiny",
    "sharding": "policies.sharding",
    "logprobs": "policies.logprobs",
    "token_stats": "policies.token_stats",
    "sampling": "policies.tiny_sampling",
    "episode": "tasks.episode",
    "scoring": "rollout.scoring",
    "dynamic_sampling": "rollout.dynamic_sampling",
    "off_policy": "rollout.off_policy",
    "recipe_inputs": "rollout.recipe_inputs",
    "task_base": "tasks.base",
    "builtin_tasks": "tasks.builtin",
    "text_tasks": "tasks.text",
    "metrics": "logs.metrics",
    "sample_log": "logs.sample_log",
    "heatmap_log": "logs.heatmap_log",
    "evaluation": "logs.evaluation",
    "cli_args": "run.cli_args",
    "run_dirs": "run.run_dirs",
    "callbacks": "run.callbacks",
    "resume": "run.resume",
    "output_filters": "run.output_filters",
}

_PREFIX = "lightning_adv.trainer."


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec: Any) -> ModuleType:
        warnings.warn(f"{spec.name} is deprecated; import {self.new}", DeprecationWarning,
                      stacklevel=2)
        module = importlib.import_module(self.new)
        self.spec = module.__spec__  # the import system overwrites it with the old name's
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec  # the module is already executed: keep its own spec


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds each old module name of :data:`MOVED` as its new module."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        old = fullname[len(_PREFIX):] if fullname.startswith(_PREFIX) else None
        if old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(_PREFIX + MOVED[old]))


def install() -> None:
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
