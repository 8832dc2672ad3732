"""Importable helpers for trainer tests: user functions named by dotted path in configs."""

import math
import os
import subprocess
import sys
from pathlib import Path

import torch

from lightning_adv import AdvantageModule, TemporalResult
from lightning_adv.trainer.tasks.runtime import ReverseTask, Task


def nan_reward(sample):
    return math.nan


def sometimes_unscorable(sample):
    """Exact match, but None (could not score) for responses of odd length: a reward
    function that gives up on some rows (a verifier that cannot parse the answer)."""
    if len(sample.response) % 2:
        return None
    return float(sample.response == sample.target)


def nan_when_odd(sample):
    """As :func:`sometimes_unscorable`, with NaN for "could not score"."""
    return math.nan if len(sample.response) % 2 else float(sample.response == sample.target)


def graded_unless_odd(sample):
    """The fraction of target positions the response matches (a spread of rewards from an
    untrained policy), but None (could not score) for responses of odd length."""
    if len(sample.response) % 2:
        return None
    hits = sum(a == b for a, b in zip(sample.response, sample.target))
    return hits / max(len(sample.target), 1)


def string_reward(sample):
    return "1.0"


def bool_reward(sample):
    return sample.response == sample.target


def tensor_reward(sample):
    return torch.tensor(0.5)


def response_length_reward(sample):
    """Rewards that differ between random responses (a learning signal at step one)."""
    return len(sample.response) / 10


def wrong_length_scorer(sample):
    return [0.0] * (sample.num_tokens + 3)


def per_turn_scorer(sample):
    return [float(i) for i in range(len(sample.turns))]


class EmptyPromptTask(ReverseTask):
    def prompt(self, instance):
        return ""


class UnscorableReverseTask(ReverseTask):
    """``reverse`` whose own reward gives up (None) on responses of odd length."""

    def reward(self, sample):
        return None if len(sample.response) % 2 else super().reward(sample)


class EmptyReplyTask(Task):
    """A two-turn task whose environment answers with an empty string."""

    symbols = "ab"
    max_prompt_len = 1
    max_new_tokens = 2
    max_turns = 2
    max_reply_len = 1

    def make_instance(self, rng):
        return 0

    def prompt(self, instance):
        return "a"

    def reply(self, instance, turns):
        return ""

    def reward(self, sample):
        return 0.0


class ScaledAdvantageModule(AdvantageModule):
    """A user subclass: counts its calls and halves the advantages."""

    calls = 0

    def forward(self, batch, meta=None, *, prm=None, kl_coef=None):
        type(self).calls += 1
        out = super().forward(batch, meta, prm=prm, kl_coef=kl_coef)
        out["advantages"] = out["advantages"] * 0.5
        return out


class RecordingAdvantageModule(AdvantageModule):
    """Saves what each call returns to ``$LIGHTNING_ADV_RECORD/rank<r>_call<n>.pt``."""

    def __init__(self, config):
        super().__init__(config)
        self.calls = 0

    def record(self, batch, meta, out):
        keep = ("advantages", "returns", "rewards", "tot_rewards", "kl_rewards", "loss_mask")
        keep += tuple(k for k in ("reward_baselines", "sum_pi_squared", "entropies") if k in out)
        return {k: out[k] for k in keep}

    def forward(self, batch, meta=None, *, prm=None, kl_coef=None):
        import os
        import torch.distributed as dist
        out = super().forward(batch, meta, prm=prm, kl_coef=kl_coef)
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        torch.save(self.record(batch, meta, out),
                   os.path.join(os.environ["LIGHTNING_ADV_RECORD"], f"rank{rank}_call{self.calls}.pt"))
        self.calls += 1
        return out


def ddp_fit(config: Path, save_dir: Path, record: Path, *args: str,
            recorder: str = "RecordingAdvantageModule") -> subprocess.CompletedProcess:
    """``python -m lightning_adv fit`` on two gloo processes (DDP on CPU), recording each
    advantage call under ``record`` (``recorder``, a class of this module)."""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "LIGHTNING_ADV_RECORD": str(record),
           "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "lightning_adv", "fit", "--config", str(config),
           "--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.accelerator=cpu",
           f"--trainer.logger.init_args.save_dir={save_dir}",
           f"--model.advantage_module={__name__}.{recorder}", *args]
    return subprocess.run(cmd, cwd=save_dir, env=env, capture_output=True, text=True, timeout=600)


class UnscorableRecordingAdvantageModule(RecordingAdvantageModule):
    """Records, with each call's result, its input rewards (NaN: unscorable) and the
    ``unscorable`` output."""

    def record(self, batch, meta, out):
        kept = super().record(batch, meta, out)
        kept.update(input_rewards=batch["rewards"].clone(), unscorable=out["unscorable"],
                    group_sizes=list(meta.traj_group_sizes))
        if "values" in batch:
            kept["input_values"] = batch["values"].clone()
        return kept


class BatchRecordingAdvantageModule(RecordingAdvantageModule):
    """Records each call's input batch (one dict per prompt, as ``split_batch`` returns it)
    and its advantages."""

    def record(self, batch, meta, out):
        from lightning_adv.batch.grouping import split_batch

        return {"inputs": split_batch({k: v.cpu() for k, v in batch.items()}, meta),
                "advantages": out["advantages"].cpu(), "loss_mask": out["loss_mask"].cpu()}


def nan_estimator(inputs):
    """A user estimator whose advantages are NaN (a division by a zero std of its own)."""
    adv = inputs.outcome_rewards.flip(1).cumsum(1).flip(1) * inputs.loss_mask
    return TemporalResult(adv * float("nan"), adv + inputs.values, inputs.outcome_rewards)


def failing_estimator(inputs):
    """A user estimator with a bug of its own."""
    return 1 / 0


class OldForwardAdvantageModule(AdvantageModule):
    """A subclass written before forward took kl_coef."""

    def forward(self, batch, meta=None, *, prm=None):
        return super().forward(batch, meta, prm=prm)


def response_code(sample):
    """The response itself as a number (its symbols ``abcde=`` are the digits 1..6 of base
    7): a reward from which the scored text can be read back
    (tests/trainer/test_vine_trainer.py)."""
    return float(sum(("abcde=".index(c) + 1) * 7 ** i for i, c in enumerate(sample.response)))


def response_of_code(code):
    """The response :func:`response_code` scored."""
    code, symbols = int(code), []
    while code:
        code, digit = divmod(code, 7)
        symbols.append("abcde="[digit - 1])
    return "".join(symbols)
