"""How far each recipe of ``lightning_adv.recipes`` is from the same-named estimator of
verl, OpenRLHF and TRL, measured on one typical batch.

verl's estimators run verl's released code (the pinned ``core_algos.py`` of verl 0.9.1,
its sha256 checked); OpenRLHF's (``experience_maker.py``) and TRL's (``GRPOTrainer`` and
``RLOOTrainer``, which compute them inline) are re-implemented here from their code, each
with its own constants (eps, biased or unbiased std, the rule for a group of one, where
the KL penalty enters). Each is compared with the recipe's advantages
on the generated tokens. The batch: 16 prompts x 8 responses, binary rewards (each
prompt's success rate uniform in [0, 1]; graded rewards in quarters for pass@k, where a
binary group rarely has a unique best), a second binary "format" reward for the
multi-reward estimators, response lengths 8-48 tokens, behaviour log-probs -Exp(0.5) per
token and a reference policy 0.05 nats away; seeded, so the numbers are reproducible.
KL coefficients are matched on both sides (the recipe's); where a peer puts the KL
elsewhere by default the page says so instead of measuring a different setting.

    python scripts/recipe_differences.py                               # print the table
    python scripts/recipe_differences.py --page docs/design/peers.md   # write it there

``--page`` replaces the table between the page's ``recipe-differences`` markers;
``tests/docs/test_recipe_differences.py`` checks that the page holds exactly this output.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_adv import AdvantageModule, concat_batch
from lightning_adv.recipes import recipe

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # (the pins live in the tests' support package)
    sys.path.insert(0, str(ROOT))

if str(ROOT / "scripts") not in sys.path:  # (the table writer beside this script)
    sys.path.insert(0, str(ROOT / "scripts"))
from marked_tables import replace_marked, table_command  # noqa: E402

PROMPTS, SAMPLES = 16, 8
MIN_LEN, MAX_LEN = 8, 48


@dataclass
class Batch:
    """Response-major tensors as the peers see them, plus the groups."""

    rewards: torch.Tensor        # [B] float64, binary
    graded: torch.Tensor         # [B] float64 in {0, .25, .5, .75, 1} (tests passed)
    format_rewards: torch.Tensor  # [B] float64, binary
    baselines: torch.Tensor      # [B] greedy reward of the row's prompt
    mask: torch.Tensor           # [B, L] response mask
    old: torch.Tensor            # [B, L] behaviour log-probs of the response tokens
    ref: torch.Tensor            # [B, L] reference log-probs
    sum_pi_squared: torch.Tensor  # [B, L]
    index: torch.Tensor          # [B] prompt of each row


def typical_batch(seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    b = PROMPTS * SAMPLES
    p = torch.rand(PROMPTS, generator=g, dtype=torch.float64).repeat_interleave(SAMPLES)
    rewards = (torch.rand(b, generator=g, dtype=torch.float64) < p).double()
    format_rewards = (torch.rand(b, generator=g, dtype=torch.float64) < 0.7).double()
    graded = torch.randint(0, 5, (b,), generator=g).double() / 4
    baselines = (p > 0.5).double()
    lengths = torch.randint(MIN_LEN, MAX_LEN + 1, (b,), generator=g)
    mask = (torch.arange(MAX_LEN)[None, :] < lengths[:, None]).double()
    old = -torch.empty(b, MAX_LEN, dtype=torch.float64).exponential_(2.0, generator=g) * mask
    ref = (old + 0.05 * torch.randn(b, MAX_LEN, generator=g, dtype=torch.float64)) * mask
    pi = old.exp()
    rest = (1 - pi) ** 2 * torch.rand(b, MAX_LEN, generator=g, dtype=torch.float64)
    return Batch(rewards, graded, format_rewards, baselines, mask, old, ref, (pi ** 2 + rest) * mask,
                 torch.arange(PROMPTS).repeat_interleave(SAMPLES))


# ------------------------------------------------------------------ ours

def ours(name: str, batch: Batch) -> torch.Tensor:
    """The recipe's advantages in response-major layout [B, L] (prompt of one token)."""
    prompts = []
    width = MAX_LEN + 1
    for q in range(PROMPTS):
        rows = (batch.index == q).nonzero().flatten()
        n = len(rows)
        mask = batch.mask[rows]
        loss = torch.zeros(n, width, dtype=torch.int64)
        loss[:, 1:] = mask.long()
        attention = torch.zeros(n, width, dtype=torch.bool)
        attention[:, 0] = True
        attention[:, 1:] = mask.bool()
        logprobs = torch.zeros(n, width)
        logprobs[:, 1:] = batch.old[rows].float()
        ref = torch.zeros(n, width)
        ref[:, :-1] = batch.ref[rows].float()  # next-token: column t scores token t+1
        spq = torch.zeros(n, width)
        spq[:, :-1] = batch.sum_pi_squared[rows].float()
        rewards = batch.rewards[rows].float()
        if name == "gdpo":
            rewards = torch.stack([rewards, batch.format_rewards[rows].float()], dim=1)
        prompts.append({"input_ids": torch.ones(n, width, dtype=torch.int64) * attention,
                        "attention_mask": attention, "loss_mask": loss, "logprobs": logprobs,
                        "ref_logp": ref, "sum_pi_squared": spq, "rewards": rewards,
                        "reward_baselines": batch.baselines[rows].float(),
                        "is_truncated": torch.zeros(n, dtype=torch.bool)})
    out_batch, meta = concat_batch(prompts)
    overrides = {"reward_weights": [1.0, 1.0]} if name == "gdpo" else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = AdvantageModule(recipe(name, **overrides))(out_batch, meta)
    return out["advantages"][:, :MAX_LEN].double() * batch.mask


# ------------------------------------------------------------------ the peers

def _groups(batch: Batch) -> list[torch.Tensor]:
    return [(batch.index == q).nonzero().flatten() for q in range(PROMPTS)]


def _broadcast(scores: torch.Tensor, batch: Batch) -> torch.Tensor:
    return scores[:, None] * batch.mask


def _returns(token_rewards: torch.Tensor, batch: Batch) -> torch.Tensor:
    return (token_rewards * batch.mask).flip(-1).cumsum(-1).flip(-1)


def _outcome_tokens(scores: torch.Tensor, batch: Batch) -> torch.Tensor:
    """The outcome at each row's last response token."""
    last = batch.mask.sum(1).long() - 1
    out = torch.zeros_like(batch.mask)
    out[torch.arange(len(last)), last] = scores
    return out


def verl_core_algos() -> Any:
    """verl's released ``core_algos`` (the pinned verl 0.9.1 file, its sha256 checked
    against the pin the tests use): the verl columns run verl's own estimators."""
    from tests.support.peers import INSTALL, VERL_CORE_ALGOS, file_sha256

    name, sha256 = VERL_CORE_ALGOS
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        raise SystemExit(f"the verl columns run verl's code, not importable here ({exc}): "
                         f"{INSTALL['verl']}") from exc
    if file_sha256(module.__file__) != sha256:
        raise SystemExit(f"{module.__file__} is not the pinned verl 0.9.1 file "
                         f"(sha256 {sha256})")
    return module


def verl(estimator: str, batch: Batch, kl: float = 0.0, **kwargs: Any) -> torch.Tensor:
    """verl's ``compute_<estimator>_advantage`` called as its trainer's
    ``compute_advantage`` calls it: the outcome at each row's last token, and with ``kl``
    the token KL penalty of its ``apply_kl_penalty`` (``kl_penalty="kl"``, k1) in the
    token-level rewards; ``index`` the prompt uid of each row."""
    from verl.trainer.config import AlgoConfig

    core_algos = verl_core_algos()
    token_rewards = _outcome_tokens(batch.rewards, batch)
    if kl:
        token_rewards = token_rewards - kl * core_algos.kl_penalty(
            batch.old, batch.ref, kl_penalty="kl") * batch.mask
    args = {"token_level_rewards": token_rewards, "response_mask": batch.mask, **kwargs}
    if estimator == "remax":
        args["reward_baselines"] = batch.baselines
    else:
        args["index"] = np.array([f"prompt-{int(q)}" for q in batch.index], dtype=object)
    if estimator == "grpo":  # (verl's trainer passes no config to GRPO)
        fn = core_algos.compute_grpo_outcome_advantage
    else:
        fn = core_algos.get_adv_estimator_fn(estimator)
        args["config"] = AlgoConfig()
    if estimator == "optimal_token_baseline":
        args.update(old_log_probs=batch.old, sum_pi_squared=batch.sum_pi_squared)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        advantages, _ = fn(**args)
    return advantages.double() * batch.mask


def _kl_rewards(batch: Batch, coef: float) -> torch.Tensor:
    return -coef * (batch.old - batch.ref) * batch.mask


def _whiten_openrlhf(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    n = mask.sum()
    mean = (x * mask).sum() / n
    var = ((x - mean) ** 2 * mask).sum() / n
    return (x - mean) * var.clamp(min=1e-8).rsqrt() * mask


def openrlhf(batch: Batch, estimator: str, kl: float = 0.0) -> torch.Tensor:
    r = batch.rewards.view(PROMPTS, SAMPLES)
    if estimator == "rloo":
        r = r - (r.sum(-1, keepdim=True) - r) / (SAMPLES - 1)
    elif estimator in ("reinforce_baseline", "dr_grpo"):
        r = r - r.mean(-1, keepdim=True)
    elif estimator == "group_norm":
        r = (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-9)
    token = _outcome_tokens(r.reshape(-1), batch) + _kl_rewards(batch, kl)
    returns = _returns(token, batch)
    if estimator in ("reinforce", "reinforce_baseline"):
        return _whiten_openrlhf(returns, batch.mask)
    return returns * batch.mask


def _nanstd(x: torch.Tensor, dim=None) -> torch.Tensor:
    return x.std(dim=dim) if dim is not None else x.std()


def trl_grpo(batch: Batch, scale: str) -> torch.Tensor:
    r = batch.rewards.view(PROMPTS, SAMPLES)
    mean = r.mean(1, keepdim=True)
    std = {"group": _nanstd(r, 1)[:, None], "batch": _nanstd(r).expand(PROMPTS, 1),
           "none": torch.zeros(PROMPTS, 1, dtype=r.dtype)}[scale]
    adv = r - mean
    if scale != "none":
        adv = adv / (std + 1e-4)
    return _broadcast(adv.reshape(-1), batch)


def trl_gdpo(batch: Batch) -> torch.Tensor:
    cols = torch.stack([batch.rewards, batch.format_rewards], 1).view(PROMPTS, SAMPLES, 2)
    normed = (cols - cols.mean(1, keepdim=True)) / (cols.std(1, keepdim=True) + 1e-4)
    summed = normed.reshape(-1, 2).sum(1)
    return _broadcast((summed - summed.mean()) / (summed.std() + 1e-4), batch)


def trl_rloo(batch: Batch, beta: float = 0.05) -> torch.Tensor:
    kl = ((batch.old - batch.ref) * batch.mask).sum(1)
    r = (batch.rewards - beta * kl).view(PROMPTS, SAMPLES)
    adv = r - (r.sum(1, keepdim=True) - r) / (SAMPLES - 1)
    return _broadcast(adv.reshape(-1), batch)


# ------------------------------------------------------------------ the table

#: recipe -> [(peer estimator, its formula, what differs)]
COMPARISONS: dict[str, list[tuple[str, Callable[[Batch], torch.Tensor], str]]] = {
    "grpo": [
        ("verl `grpo`", lambda b: verl("grpo", b), "eps 1e-6 (ours 1e-5); a group of one gets r / (1 + eps)"),
        ("OpenRLHF `group_norm`", lambda b: openrlhf(b, "group_norm"),
         "eps 1e-9; KL in the token rewards by default (`--algo.kl.init_coef` 0.01, k1)"),
        ("TRL GRPO (`scale_rewards=group`)", lambda b: trl_grpo(b, "group"), "eps 1e-4")],
    "dr_grpo": [
        ("verl `grpo`, `norm_adv_by_std_in_grpo=False`", lambda b: verl("grpo", b, norm_adv_by_std_in_grpo=False),
         "a group of one gets r"),
        ("OpenRLHF `dr_grpo`", lambda b: openrlhf(b, "dr_grpo"), "KL in the token rewards by default"),
        ("TRL GRPO (`scale_rewards=none`)", lambda b: trl_grpo(b, "none"), "none")],
    "rloo": [
        ("verl `rloo`", lambda b: verl("rloo", b), "a group of one gets r"),
        ("OpenRLHF `rloo`", lambda b: openrlhf(b, "rloo"),
         "KL in the token rewards by default (measured without)"),
        ("TRL RLOO (beta 0.05)", trl_rloo,
         "TRL subtracts beta x the sequence KL first: that is recipe `rloo_kl`")],
    "reinforce_pp": [
        ("verl `reinforce_plus_plus`", lambda b: verl("reinforce_plus_plus", b, kl=0.01), "whitening rsqrt(var + 1e-8), ours / (std + 1e-5)"),
        ("OpenRLHF `reinforce`", lambda b: openrlhf(b, "reinforce", kl=0.01),
         "biased variance, rsqrt(max(var, 1e-8))")],
    "reinforce_pp_baseline": [
        ("verl `reinforce_plus_plus_baseline`",
         lambda b: verl("reinforce_plus_plus_baseline", b, kl=0.01),
         "verl sums the token KL into one score per row (every token the same); ours keeps it "
         "per token in the return-to-go"),
        ("OpenRLHF `reinforce_baseline`", lambda b: openrlhf(b, "reinforce_baseline", kl=0.01),
         "biased variance in the whitening")],
    "opo": [("verl `opo`", lambda b: verl("opo", b), "a group of one gets r")],
    "gpg": [("verl `gpg`", lambda b: verl("gpg", b),
             "verl's alpha is B / (rows with a non-zero reward), ours B / (rows of groups whose "
             "rewards are not all equal)")],
    "grpo_passk": [("verl `grpo_passk`", lambda b: verl("grpo_passk", b), "none (graded rewards)")],
    "gdpo": [("TRL GRPO (`multi_objective_aggregation=normalize_then_sum`)", trl_gdpo,
              "none (two binary reward columns)")],
    "grpo_batch_std": [("TRL GRPO (`scale_rewards=batch`)", lambda b: trl_grpo(b, "batch"), "none")],
    "rloo_kl": [("TRL RLOO (beta 0.05)", trl_rloo, "none")],
    "remax": [("verl `remax`", lambda b: verl("remax", b, kl=0.001), "none")],
    "optimal_token_baseline": [("verl `optimal_token_baseline`",
                                lambda b: verl("optimal_token_baseline", b), "none")],
}

#: recipes compared on the graded rewards
GRADED = {"grpo_passk"}


def differences(seed: int = 0) -> list[tuple[str, str, str, float, float]]:
    """(recipe, peer, what differs, max |difference| on generated tokens, that over the
    standard deviation of the peer's advantages)."""
    plain = typical_batch(seed)
    graded = dataclasses.replace(plain, rewards=plain.graded)
    active = plain.mask > 0
    rows = []
    for name, peers in COMPARISONS.items():
        batch = graded if name in GRADED else plain
        mine = ours(name, batch)
        for peer, fn, note in peers:
            theirs = fn(batch)
            gap = float((mine - theirs)[active].abs().max())
            rows.append((name, peer, note, gap, gap / float(theirs[active].std())))
    return rows


def markdown(seed: int = 0) -> str:
    lines = ["| recipe | peer estimator | what differs | max abs difference | / peer's std |",
             "|---|---|---|---|---|"]
    for name, peer, note, gap, rel in differences(seed):
        lines.append(f"| `{name}` | {peer} | {note} | {gap:.2g} | {rel:.2g} |")
    return "\n".join(lines)


BEGIN, END = "<!-- recipe-differences:begin -->\n", "\n<!-- recipe-differences:end -->"


def replace_table(text: str, table: str) -> str:
    """``text`` with the table between this script's markers replaced."""
    return replace_marked(text, BEGIN, END, table)


if __name__ == "__main__":
    table_command(markdown, BEGIN, END, __doc__.split("\n\n")[0])
