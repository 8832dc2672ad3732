"""A callback the sharding tests add to a CLI run (``--trainer.callbacks+=...``): it saves,
per rank, how each weight of the module is held when training starts (a DTensor sharded
over the ranks, or a plain tensor) and, when training ends, the greedy response of the
trained policy to a few prompts, as the trainer's own sampler produces it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

from lightning_adv.trainer.data import generator

#: prompt indices whose greedy responses are recorded
PROMPTS = [0, 1, 2]


class ShardingProbe(pl.Callback):
    """Writes ``$LIGHTNING_ADV_RECORD/rank<r>_weights.pt`` and ``rank<r>_greedy.pt``."""

    def __init__(self) -> None:
        self.out = Path(os.environ["LIGHTNING_ADV_RECORD"])

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from torch.distributed.tensor import DTensor

        held = {}
        for name, tensor in pl_module.state_dict().items():
            if isinstance(tensor, DTensor):
                held[name] = {"sharded": True, "shape": tuple(tensor.shape),
                              "local": tuple(tensor.to_local().shape),
                              "placements": [f"{type(p).__name__}({getattr(p, 'dim', '')})"
                                             for p in tensor.placements],
                              "ranks": tensor.device_mesh.size()}
            else:
                held[name] = {"sharded": False, "shape": tuple(tensor.shape)}
        torch.save(held, self.out / f"rank{trainer.global_rank}_weights.pt")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        request = pl_module.rollouts.request(PROMPTS, 1, greedy=True)
        groups = pl_module.policy.generate(pl_module.runtime, request, generator(0, "probe"))
        records = []
        for (episode,) in groups:
            start = episode.generated.index(True)
            records.append({"prompt": episode.tokens[:start], "response": episode.tokens[start:]})
        torch.save(records, self.out / f"rank{trainer.global_rank}_greedy.pt")


def two_process_fit(config: Path, save_dir: Path, record: Path, strategy: str, *args: str,
                    accelerator: str = "cpu", timeout: int = 900) -> subprocess.CompletedProcess:
    """``python -m lightning_adv fit`` on two processes (CPU: gloo; ``accelerator="gpu"``:
    two GPUs, nccl) under ``strategy`` (``ddp``, ``fsdp2``), recording each advantage call
    (:class:`~tests.support.trainer_helpers.RecordingAdvantageModule`) and the
    :class:`ShardingProbe`'s files under ``record``."""
    record.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "LIGHTNING_ADV_RECORD": str(record), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "lightning_adv", "fit", "--config", str(config),
           f"--trainer.strategy={strategy}", "--trainer.devices=2", f"--trainer.accelerator={accelerator}",
           f"--trainer.logger.init_args.save_dir={save_dir}",
           "--model.advantage_module=tests.support.trainer_helpers.RecordingAdvantageModule",
           f"--trainer.callbacks+={__name__}.ShardingProbe", *args]
    return subprocess.run(cmd, cwd=save_dir, env=env, capture_output=True, text=True,
                          timeout=timeout)
