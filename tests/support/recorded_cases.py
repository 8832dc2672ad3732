"""Loading and driving the recorded legacy cases of ../shared/reference (see its README)."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch

from lightning_adv import (
    ActorConfig, AdvantageModule, NormConfig, PRMAdvantageShapingConfig, RolloutGroup, concat_batch)

REPO = Path(__file__).resolve().parents[2]
# The cases are vendored under tests/data so a clean checkout can run them; when the
# shared reference folder sits beside the checkout, its (possibly newer) cases join in.
VENDORED = REPO / "tests" / "data" / "recorded_cases"
SHARED = Path(os.environ.get("LIGHTNING_ADV_REFERENCE_CASES",
                             REPO.parent / "shared" / "reference" / "cases"))


def case_paths() -> list[Path]:
    cases = {p.name: p for p in sorted(VENDORED.glob("*.pt"))}
    cases.update({p.name: p for p in sorted(SHARED.glob("*.pt"))})
    return [cases[name] for name in sorted(cases)]


def load_case(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def actor_config(case: dict) -> ActorConfig:
    cfg = dict(case["config"])
    for key in ("reward_norm", "adv_norm"):
        if cfg.get(key) is not None:
            cfg[key] = NormConfig(**cfg[key])
    if isinstance(cfg.get("gae_lambda"), str):
        cfg["gae_lambda"] = "lightning_adv." + cfg["gae_lambda"].rsplit(".", 1)[1]
    cfg.pop("temperature", None)
    cfg.pop("m2_threshold", None)
    return ActorConfig(**cfg)


def build_inputs(case: dict):
    """The batch, meta and call-time prm of one case, built as the reference README says."""
    trajs = copy.deepcopy(case["trajectories"])
    for t in trajs:
        if t.get("rollout_group") is not None:
            g = t["rollout_group"]
            t["rollout_group"] = RolloutGroup(tuple(g["row_counts"]), tuple(g["rewards"]))
    call = case["call"]
    prm = PRMAdvantageShapingConfig(mode=call["advantage_shaping_mode"],
                                    negative_scale=call["gvpo_negative_scale"],
                                    zero_penalty=call["gvpo_zero_penalty"],
                                    zero_eps=call["gvpo_zero_eps"])
    batch, meta = concat_batch(trajs)
    return batch, meta, prm


def build_case(case: dict):
    """The module, batch, meta and prm of one case."""
    batch, meta, prm = build_inputs(case)
    return AdvantageModule(actor_config(case)), batch, meta, prm


def run_case(case: dict):
    """Run one case exactly as the reference README drives it; returns (out, batch)."""
    module, batch, meta, prm = build_case(case)
    return module(batch, meta, prm=prm), batch


def mismatches(out: dict, expected: dict, tol: float = 1e-5) -> list[str]:
    problems = []
    for key, want in expected.items():
        if key not in out:
            problems.append(f"{key}: missing")
            continue
        got = out[key]
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            problems.append(f"{key}: shape {getattr(got, 'shape', None)} != {tuple(want.shape)}")
            continue
        if want.dtype == torch.bool or not want.is_floating_point():
            if got.dtype != want.dtype and key == "rewards":
                problems.append(f"{key}: dtype {got.dtype} != {want.dtype}")
            elif not torch.equal(got.to(want.dtype), want):
                problems.append(f"{key}: values differ")
            continue
        err = ((got.double() - want.double()).abs() / want.double().abs().clamp_min(1.0)).max()
        if not err <= tol:
            problems.append(f"{key}: max rel err {err.item():.3g}")
    return problems
