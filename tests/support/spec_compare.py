"""Comparing the module's output with the spec pipeline.

Every output is compared at ``|got - want| <= 1e-5 * max(|want|, 1)``, except where the
spec's own arithmetic is ill-conditioned in float32, which no implementation can match
to 1e-5:

- advantage normalization divides by ``std + eps``; when a group's advantages are (nearly)
  equal, float32 rounding of the advantages (a few ulps, also between identical rows that
  a vectorized kernel computes in different SIMD lanes) is amplified by ``1 / (std + eps)``.
  The allowed error there is the first-order bound ``delta * (3 + 2|y|) / (std + eps)``
  with ``delta = 2e-6 * max(1, max|A_raw|, max|values|)``, which is ~1e-5 when the std is
  of order one and honest (large) when it is ~0;
- gvpo / process_weighted are discontinuous at ``|A| = zero_eps`` and ``A = 0``; when the
  normalized advantage lies within that error of a boundary, the value of either side is
  accepted. (The exact boundaries are tested separately with exact inputs.)
"""

from __future__ import annotations


import torch

from tests.support.spec_pipeline import shape_one

FLOAT_KEYS = ("advantages", "unnormalized_advantages", "returns", "tot_rewards", "kl_rewards", "loss_mask", "logprobs",
              "prox_logp", "ref_logp", "mopd_behavior_logprobs")
RTOL = 1e-5


def close(got: float, want: float, extra: float = 0.0) -> bool:
    return abs(got - want) <= RTOL * max(abs(want), 1.0) + extra


def compare_outputs(got: dict, want: dict, details: dict) -> list[str]:
    """Every disagreement between the module's dict and the reference's, as text."""
    problems = []
    for key in want:
        if key not in got:
            problems.append(f"{key}: missing from the module's output")
    for key in got:
        if key not in want:
            problems.append(f"{key}: in the module's output, not in the reference's")
    for key in FLOAT_KEYS:
        if key not in want or key not in got:
            continue
        g, w = got[key], want[key]
        if tuple(g.shape) != tuple(w.shape):
            problems.append(f"{key}: shape {tuple(g.shape)} != {tuple(w.shape)}")
            continue
        if g.dtype != w.dtype:
            problems.append(f"{key}: dtype {g.dtype}, expected {w.dtype}")
            continue
        if key == "advantages":
            problems += compare_advantages(g, details)
            continue
        err = (g.double() - w.double()).abs() / w.double().abs().clamp_min(1.0)
        if not err.max() <= RTOL:
            idx = tuple(int(i) for i in torch.nonzero(err == err.max())[0])
            problems.append(f"{key}: max rel err {err.max().item():.3g} at {idx}: "
                            f"got {g[idx].item()!r}, want {w[idx].item()!r}")
    if "rewards" in want and "rewards" in got:
        g, w = got["rewards"], want["rewards"]
        if g.dtype != w.dtype:
            problems.append(f"rewards: dtype {g.dtype} != {w.dtype}")
        elif not all(close(a, b) for a, b in zip(g.double().tolist(), w.double().tolist())):
            problems.append(f"rewards: {g.tolist()} != {w.tolist()}")
    if "is_truncated" in want and "is_truncated" in got:
        g, w = got["is_truncated"], want["is_truncated"]
        if g.dtype != torch.bool or not torch.equal(g, w):
            problems.append(f"is_truncated: {g.tolist()} ({g.dtype}) != {w.tolist()}")
    if "input_token_loss_mask" in want and "input_token_loss_mask" in got:
        g, w = got["input_token_loss_mask"], want["input_token_loss_mask"]
        if tuple(g.shape) != tuple(w.shape) or not torch.equal(g.double(), w.double()):
            problems.append("input_token_loss_mask: differs from the input loss_mask")
    return problems


def compare_advantages(got: torch.Tensor, details: dict) -> list[str]:
    raw = details["adv_raw"]
    y = details["adv_normalized"]          # before process shaping (float32 values)
    scale = details["adv_scale"]           # None without adv_norm
    direct = details["direct"]             # None without direct token rewards
    mode, gvpo = details["mode"], details["gvpo"]
    mask = details["loss_mask"]
    values = details["values"]
    magnitude = max([1.0] + [abs(v) for row in raw for v in row]
                    + [abs(v) for row in values for v in row])
    delta = 2e-6 * magnitude
    got_rows = got.double().tolist()
    problems = []
    for b, row in enumerate(y):
        for t, a in enumerate(row):
            # error of the module's normalized advantage allowed by float32 conditioning
            tol_a = 0.0 if scale is None else delta * (3 + 2 * abs(a)) / scale[b][t]
            candidates, lipschitz, near_boundary = [a], 1.0, False
            if direct is not None:
                r, active = direct[b][t], mask[b][t] == 1
                boundaries: list[float] = []
                if mode == "gvpo" and active and r < 0:
                    lipschitz = 1 + gvpo["negative_scale"]
                    boundaries = [-gvpo["zero_eps"], gvpo["zero_eps"]]
                elif mode == "process_weighted" and active:
                    boundaries = [0.0]
                nearby = [x for x in boundaries
                          if abs(x - a) <= tol_a + RTOL * max(abs(a), 1.0)]
                near_boundary = bool(nearby)
                points = [a] + [x + s * 1e-12 for x in nearby for s in (-1, 0, 1)]
                candidates = [shape_one(p, r, active, mode, gvpo) for p in points]
            allowed = lipschitz * tol_a * (2 if near_boundary else 1)
            g = got_rows[b][t]
            if not any(close(g, c, allowed) for c in candidates):
                problems.append(
                    f"advantages[{b},{t}]: got {g!r}, want {candidates[0]!r} "
                    f"(normalized A {a!r}, extra allowed error {allowed:.3g})")
    return problems[:10]
