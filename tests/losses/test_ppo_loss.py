"""PPOLoss: hand-computed cases, a slow per-sequence loop, gradchecks, bad arguments, the
built-in trainer's loss, and DDP (gloo processes)."""

import itertools
import math

import pytest
import torch
import torch.multiprocessing as mp
from hypothesis import given, settings, strategies as st

from lightning_adv import PPOLoss
from lightning_adv.losses.ppo_loss import LOSS_AGG_MODES, kl_estimate

import tests.support.loss_ddp_workers as workers

# ---------------------------------------------------------------- the slow reference loop


def reference(cfg: dict, logprobs, old_logprobs, advantages, loss_mask, ref_logprobs=None,
              values=None, old_values=None, returns=None, entropy=None) -> dict:
    """The loss written out per sequence and per token, with Python floats."""
    lp, old, adv, mask, ref = logprobs, old_logprobs, advantages, loss_mask, ref_logprobs
    lo = cfg.get("clip_eps", 0.2)
    hi = cfg.get("clip_eps_high") or lo
    dual, mode = cfg.get("dual_clip"), cfg.get("loss_agg_mode", "token-mean")
    lp, old, adv, mask = lp.tolist(), old.tolist(), adv.tolist(), mask.tolist()
    rows = range(len(mask))

    def active(b):
        return [t for t in range(len(mask[b])) if mask[b][t] == 1]

    def agg(per_token):  # per_token[b][t], read on active tokens only
        sums = [sum(per_token[b][t] for t in active(b)) for b in rows]
        counts = [len(active(b)) for b in rows]
        nonempty = [b for b in rows if counts[b]]
        if mode == "token-mean":
            return sum(sums) / max(sum(counts), 1)
        if mode == "seq-mean-token-sum":
            return sum(sums[b] for b in nonempty) / max(len(nonempty), 1)
        if mode == "seq-mean-token-mean":
            return sum(sums[b] / counts[b] for b in nonempty) / max(len(nonempty), 1)
        if mode == "token-sum":
            return sum(sums)
        return sum(sums) / max(len(nonempty), 1) / cfg["loss_scale_factor"]

    def mean(per_token):
        n = sum(len(active(b)) for b in rows)
        return sum(per_token[b][t] for b in rows for t in active(b)) / max(n, 1)

    def bound(x):
        return min(max(x, -20.0), 20.0)

    pg = [[0.0] * len(mask[b]) for b in rows]
    clipped = [[0.0] * len(mask[b]) for b in rows]
    approx = [[0.0] * len(mask[b]) for b in rows]
    for b in rows:
        tokens = active(b)
        seq_log_ratio = sum(lp[b][t] - old[b][t] for t in tokens) / max(len(tokens), 1)
        for t in tokens:
            token_log_ratio = lp[b][t] - old[b][t]
            log_ratio = seq_log_ratio if cfg.get("ratio_level") == "sequence" else token_log_ratio
            r = math.exp(bound(log_ratio))
            a = adv[b][t]
            loss = max(-a * r, -a * min(max(r, 1 - lo), 1 + hi))
            if dual is not None and a < 0:
                loss = min(loss, -a * dual)
            pg[b][t] = loss
            clipped[b][t] = float(r > 1 + hi or r < 1 - lo)
            approx[b][t] = math.exp(token_log_ratio) - 1 - token_log_ratio
    out = {"policy_loss": mean(pg), "clipfrac": mean(clipped), "approx_kl": mean(approx)}
    total = agg(pg)
    if entropy is not None:
        ent = entropy.tolist()
        out["entropy"] = mean(ent)
        total -= cfg.get("entropy_coef", 0.0) * agg(ent)
    if values is not None:
        v, ret = values.tolist(), returns.tolist()
        vl = [[0.0] * len(mask[b]) for b in rows]
        c = cfg.get("value_clip_eps")
        for b in rows:
            for t in active(b):
                err = (v[b][t] - ret[b][t]) ** 2
                if c is not None:
                    o = old_values[b][t].item()
                    err = max(err, (o + min(max(v[b][t] - o, -c), c) - ret[b][t]) ** 2)
                vl[b][t] = 0.5 * err
        out["value_loss"] = mean(vl)
        total += cfg.get("value_coef", 0.5) * agg(vl)
    if ref is not None:
        rf, kl = ref.tolist(), [[0.0] * len(mask[b]) for b in rows]
        for b in rows:
            for t in active(b):
                d = lp[b][t] - rf[b][t]
                kl[b][t] = reference_kl(d, cfg.get("kl_estimator", "k3"))
        out["kl_loss"] = mean(kl)
        total += cfg.get("kl_coef", 0.0) * agg(kl)
    out["loss"] = total
    return out


def reference_kl(d: float, estimator: str) -> float:
    if estimator == "k1":
        return d
    if estimator == "k2":
        return d * d / 2
    if estimator == "abs":
        return abs(d)
    x = min(max(-d, -20.0), 20.0)
    return min(max(math.exp(x) - x - 1, -10.0), 10.0)


def random_inputs(seed: int, rows: int = 5, width: int = 7, dtype=torch.float64) -> dict:
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, width, generator=g) < 0.6).to(dtype)
    mask[0] = 0  # a sequence without active tokens
    mask[1, 2] = 1
    return {
        "logprobs": -torch.rand(rows, width, generator=g, dtype=dtype) * 2,
        "old_logprobs": -torch.rand(rows, width, generator=g, dtype=dtype) * 2,
        "advantages": torch.randn(rows, width, generator=g, dtype=dtype),
        "loss_mask": mask,
        "ref_logprobs": -torch.rand(rows, width, generator=g, dtype=dtype) * 2,
        "values": torch.randn(rows, width, generator=g, dtype=dtype),
        "old_values": torch.randn(rows, width, generator=g, dtype=dtype),
        "returns": torch.randn(rows, width, generator=g, dtype=dtype),
        "entropy": torch.rand(rows, width, generator=g, dtype=dtype),
    }


def call(loss: PPOLoss, data: dict) -> dict:
    d = dict(data)
    return loss(d.pop("logprobs"), d.pop("old_logprobs"), d.pop("advantages"), d.pop("loss_mask"), **d)


def full_config(mode: str, **extra) -> dict:
    cfg = dict(loss_agg_mode=mode, kl_coef=0.05, entropy_coef=0.01, value_coef=0.5,
               value_clip_eps=0.3, loss_scale_factor=6.0 if mode == "seq-mean-token-sum-norm" else None)
    cfg.update(extra)
    return cfg


# ---------------------------------------------------------------- hand-computed cases


def test_token_mean_clip_by_hand():
    # the ratios of log-probs both shifted by -3 (log-probs must be <= 0)
    lp = torch.tensor([[math.log(1.5), math.log(0.5), math.log(1.1)]], dtype=torch.float64)
    out = PPOLoss(clip_eps=0.2)(lp - 3, torch.zeros_like(lp) - 3, torch.tensor([[1.0, -1.0, 2.0]]).double(),
                                torch.ones_like(lp))
    # -min(1.5, 1.2)*1 = -1.2; A=-1: max(0.5, 0.8) = 0.8; ratio 1.1 unclipped: -2.2
    assert out["loss"].item() == pytest.approx((-1.2 + 0.8 - 2.2) / 3, abs=1e-12)
    assert out["policy_loss"].item() == pytest.approx((-1.2 + 0.8 - 2.2) / 3, abs=1e-12)
    assert out["clipfrac"].item() == pytest.approx(2 / 3)
    want_kl = sum(r - 1 - math.log(r) for r in (1.5, 0.5, 1.1)) / 3
    assert out["approx_kl"].item() == pytest.approx(want_kl, abs=1e-12)
    assert out["num_tokens"].item() == 3


def test_clip_higher_and_dual_clip_by_hand():
    lp = torch.tensor([[math.log(1.5), math.log(5.0), math.log(0.5)]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, 1.0]], dtype=torch.float64)
    mask = torch.ones_like(lp)
    out = PPOLoss(clip_eps=0.2, clip_eps_high=0.28)(lp - 3, torch.zeros_like(lp) - 3, adv, mask)
    # -min(1.5, 1.28) = -1.28; A=-1, r=5: max(5, 1.28) = 5; A=1, r=0.5: max(-0.5, -0.8) = -0.5
    assert out["loss"].item() == pytest.approx((-1.28 + 5.0 - 0.5) / 3, abs=1e-12)
    dual = PPOLoss(clip_eps=0.2, clip_eps_high=0.28, dual_clip=3.0)(lp - 3, torch.zeros_like(lp) - 3, adv, mask)
    # the negative-advantage token's loss 5 is bounded by -A * 3 = 3
    assert dual["loss"].item() == pytest.approx((-1.28 + 3.0 - 0.5) / 3, abs=1e-12)
    assert dual["dual_clipfrac"].item() == pytest.approx(1 / 3)


def test_aggregation_modes_by_hand():
    # per-token policy loss = -A (ratio 1); row 0: tokens 1, 2; row 1: token 3; row 2: none
    adv = -torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [5.0, 5.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.float64)
    lp = torch.zeros_like(adv)
    want = {"token-mean": 6 / 3, "token-sum": 6, "seq-mean-token-sum": (3 + 3) / 2,
            "seq-mean-token-mean": (1.5 + 3) / 2,
            "seq-mean-token-sum-norm": 6 / 2 / 4}  # / (non-empty sequences * the constant)
    for mode, value in want.items():
        loss = PPOLoss(loss_agg_mode=mode, loss_scale_factor=4.0 if "norm" in mode else None)
        assert loss(lp, lp, adv, mask)["loss"].item() == pytest.approx(value, abs=1e-12), mode


@pytest.mark.parametrize("estimator,d,want", [
    ("k1", 0.5, 0.5), ("k1", -0.5, -0.5), ("abs", -0.5, 0.5), ("k2", -0.5, 0.125),
    ("k3", 0.5, math.exp(-0.5) - 1 + 0.5), ("low_var_kl", -0.5, math.exp(0.5) - 1 - 0.5),
    ("k3", -30.0, 10.0),  # exp(20) - 21 clamped to 10
])
def test_kl_estimators_by_hand(estimator, d, want):
    lp = torch.tensor([[d - 31.0, 0.0]], dtype=torch.float64)  # log-probs <= 0, d apart
    ref = torch.full_like(lp, -31.0)
    assert kl_estimate(lp, ref, estimator)[0, 0].item() == pytest.approx(want, abs=1e-12)
    out = PPOLoss(kl_coef=0.5, kl_estimator=estimator)(
        lp, lp, torch.zeros_like(lp), torch.tensor([[1.0, 0.0]]), ref_logprobs=ref)
    assert out["kl_loss"].item() == pytest.approx(want, abs=1e-12)
    assert out["loss"].item() == pytest.approx(0.5 * want, abs=1e-12)


def test_value_loss_clip_and_entropy_by_hand():
    values = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    old = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
    returns = torch.tensor([[0.5, 2.0]], dtype=torch.float64)
    entropy = torch.tensor([[1.0, 3.0]], dtype=torch.float64)
    zero = torch.zeros_like(values)
    out = PPOLoss(value_coef=0.5, value_clip_eps=0.2, entropy_coef=0.1)(
        zero, zero, zero, torch.ones_like(values), values=values, old_values=old,
        returns=returns, entropy=entropy)
    # token 0: max((1-.5)^2, (0.2-.5)^2) = 0.25; token 1: max(4, 4) = 4; halves: 0.125, 2
    assert out["value_loss"].item() == pytest.approx((0.125 + 2.0) / 2)
    assert out["entropy"].item() == pytest.approx(2.0)
    assert out["loss"].item() == pytest.approx(0.5 * 2.125 / 2 - 0.1 * 2.0)


def test_sequence_ratio_by_hand():
    lp = torch.tensor([[math.log(2.0), 0.0, 5.0]], dtype=torch.float64)  # last token masked
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64)
    out = PPOLoss(clip_eps=0.5, ratio_level="sequence")(lp - 3, torch.zeros_like(lp) - 3, adv, mask)
    assert out["loss"].item() == pytest.approx(-math.sqrt(2.0), abs=1e-12)  # exp(mean log r)


# ---------------------------------------------------------------- against the loop

OPTIONS = [dict(), dict(clip_eps_high=0.28), dict(dual_clip=2.0), dict(ratio_level="sequence"),
           dict(ratio_level="sequence", dual_clip=3.0, clip_eps_high=0.3)]


@pytest.mark.parametrize("mode,options", list(itertools.product(LOSS_AGG_MODES, OPTIONS)))
@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_matches_the_slow_loop(mode, options, estimator):
    cfg = full_config(mode, kl_estimator=estimator, **options)
    for seed in range(3):
        data = random_inputs(seed)
        got = call(PPOLoss(**cfg), data)
        want = reference(cfg, **data)
        for key, value in want.items():
            assert got[key].item() == pytest.approx(value, rel=1e-10, abs=1e-12), (key, seed)


@pytest.mark.parametrize("estimator", ["k2", "abs", "low_var_kl"])
def test_other_estimators_match_the_slow_loop(estimator):
    cfg = full_config("token-mean", kl_estimator=estimator)
    data = random_inputs(7)
    got, want = call(PPOLoss(**cfg), data), reference(cfg, **data)
    assert got["kl_loss"].item() == pytest.approx(want["kl_loss"], rel=1e-10)
    assert got["loss"].item() == pytest.approx(want["loss"], rel=1e-10)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), mode=st.sampled_from(LOSS_AGG_MODES),
       pad=st.integers(1, 3), level=st.sampled_from(["token", "sequence"]))
def test_padding_and_row_order_do_not_change_the_loss(seed, mode, pad, level):
    cfg = full_config(mode, ratio_level=level, dual_clip=2.5)
    data = random_inputs(seed, rows=4, width=5)
    base = call(PPOLoss(**cfg), data)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(4, generator=g)
    # padding columns hold garbage (even -inf log-probs) under a zero mask
    padded = {k: torch.cat([v, torch.full((4, pad), -math.inf if "logprobs" in k else 7.0,
                                          dtype=v.dtype)], 1)[order] for k, v in data.items()}
    padded["loss_mask"] = torch.cat([data["loss_mask"], torch.zeros(4, pad, dtype=torch.float64)], 1)[order]
    other = call(PPOLoss(**cfg), padded)
    for key in base:
        assert torch.isfinite(other[key]).all()
        assert other[key].item() == pytest.approx(base[key].item(), rel=1e-10, abs=1e-12), key


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_gradcheck(mode, level):
    data = random_inputs(3, rows=3, width=4)
    cfg = full_config(mode, ratio_level=level, dual_clip=3.0, clip_eps_high=0.3)
    loss = PPOLoss(**cfg)

    def fn(logprobs, values, entropy):
        return loss(logprobs, data["old_logprobs"], data["advantages"], data["loss_mask"],
                    ref_logprobs=data["ref_logprobs"], values=values, old_values=data["old_values"],
                    returns=data["returns"], entropy=entropy)["loss"]

    inputs = tuple(data[k].clone().requires_grad_() for k in ("logprobs", "values", "entropy"))
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), mode=st.sampled_from(LOSS_AGG_MODES),
       level=st.sampled_from(["token", "sequence"]), size=st.integers(1, 4))
def test_micro_batches_with_the_minibatch_counts_sum_to_the_minibatch(seed, mode, level, size):
    """Gradient accumulation: each micro-batch, cut to its own last active column and
    called with ``counts=loss.counts(minibatch mask)``: the losses and gradients sum to
    the whole minibatch's, and the token-weighted diagnostics average to its own."""
    loss = PPOLoss(**full_config(mode, ratio_level=level, dual_clip=2.5))
    data = random_inputs(seed, rows=5, width=6)
    data["loss_mask"][2:, 4:] = 0  # shorter rows: their micro-batches are narrower
    grads = ("logprobs", "values", "entropy")

    def run(rows, width, counts=None):
        part = {k: v[rows, :width].clone().requires_grad_(k in grads) for k, v in data.items()}
        out = call(loss, dict(part, counts=counts))
        out["loss"].backward()
        return out, {k: part[k].grad for k in grads}

    whole, whole_grads = run(slice(None), 6)
    counts = loss.counts(data["loss_mask"])
    total, tokens, weighted = 0.0, 0.0, {}
    summed = {k: torch.zeros_like(data[k]) for k in grads}
    for start in range(0, 5, size):
        rows = slice(start, start + size)
        active = data["loss_mask"][rows].sum(0).nonzero()
        width = int(active.max()) + 1 if len(active) else 1
        part, part_grads = run(rows, width, counts)
        total += part["loss"].item()
        for k in grads:
            summed[k][rows, :width] += part_grads[k]
        n = part["num_tokens"].item()
        tokens += n
        for name, value in part.items():
            if name not in ("loss", "num_tokens"):
                weighted[name] = weighted.get(name, 0.0) + value.item() * n
    assert total == pytest.approx(whole["loss"].item(), rel=1e-10, abs=1e-12)
    for k in grads:
        assert torch.allclose(summed[k], whole_grads[k], rtol=1e-10, atol=1e-12), k
    assert tokens == whole["num_tokens"].item()
    for name, value in weighted.items():
        assert value / tokens == pytest.approx(whole[name].item(), rel=1e-10, abs=1e-12), name


def test_micro_batch_counts_by_hand():
    """token-mean over 3 active tokens in two micro-batches: each divides by 3, not by its
    own count (which would weigh the lone token of the second twice as much)."""
    loss = PPOLoss(clip_eps=0.2)
    mask = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    adv = torch.tensor([[1.0, 2.0], [0.0, 3.0]])
    zeros = torch.zeros(2, 2)
    counts = loss.counts(mask)
    assert counts.tokens.item() == 3 and counts.sequences.item() == 2
    parts = [loss(zeros[i:i + 1], zeros[i:i + 1], adv[i:i + 1], mask[i:i + 1], counts=counts)
             for i in range(2)]
    # ratio 1 everywhere: the per-token loss is -A
    assert [p["loss"].item() for p in parts] == pytest.approx([-3.0 / 3, -3.0 / 3])
    assert [p["policy_loss"].item() for p in parts] == pytest.approx([-1.5, -3.0])
    with pytest.raises(ValueError, match="PPOLoss counts"):
        loss(zeros, zeros, adv, mask, counts=3)
    with pytest.raises(ValueError, match="PPOLoss.counts loss_mask"):
        loss.counts(torch.ones(3))


def test_sequence_ratio_gradient_equals_gspo_token_for_sequence_advantages():
    """verl's GSPO-token ratio sg[s] * pi / sg[pi] has the same gradient as our sequence ratio
    when the advantage is constant within each sequence."""
    data = random_inputs(5)
    adv = torch.randn(5, 1, dtype=torch.float64).expand(5, 7).contiguous()
    mask = data["loss_mask"]
    lp = data["logprobs"].clone().requires_grad_()
    PPOLoss(loss_agg_mode="seq-mean-token-mean", ratio_level="sequence")(
        lp, data["old_logprobs"], adv, mask)["loss"].backward()
    ours = lp.grad.clone()

    lp.grad = None
    log_ratio = (lp - data["old_logprobs"]) * mask
    seq = (log_ratio.sum(1) / mask.sum(1).clamp(min=1)).detach()[:, None]
    ratio = torch.exp(lp - lp.detach() + seq)
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    rows = mask.sum(1) > 0
    loss = ((per_token * mask).sum(1)[rows] / mask.sum(1)[rows]).mean()
    loss.backward()
    assert torch.allclose(ours, lp.grad, atol=1e-12)


def test_masked_positions_get_no_gradient():
    data = random_inputs(1)
    lp = data["logprobs"].clone().requires_grad_()
    PPOLoss(kl_coef=0.1, dual_clip=2.0)(lp, data["old_logprobs"], data["advantages"], data["loss_mask"],
                                        ref_logprobs=data["ref_logprobs"])["loss"].backward()
    assert (lp.grad[data["loss_mask"] == 0] == 0).all()
    assert (lp.grad[data["loss_mask"] == 1] != 0).any()


# ---------------------------------------------------------------- bad arguments


@pytest.mark.parametrize("kwargs,name", [
    (dict(loss_agg_mode="seq-mean"), "loss_agg_mode"),
    (dict(dual_clip=1.0), "dual_clip"), (dict(dual_clip=0.5), "dual_clip"),
    (dict(clip_eps=-0.1), "clip_eps"), (dict(clip_eps_high=0.0), "clip_eps_high"),
    (dict(kl_coef=-0.1), "kl_coef"), (dict(entropy_coef=-1.0), "entropy_coef"),
    (dict(value_coef=-0.5), "value_coef"), (dict(value_clip_eps=-0.2), "value_clip_eps"),
    (dict(kl_estimator="k4"), "kl_estimator"), (dict(ratio_level="turn"), "ratio_level"),
    (dict(loss_agg_mode="seq-mean-token-sum-norm"), "loss_scale_factor"),
    (dict(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=0.0), "loss_scale_factor"),
    (dict(kl_coef=float("nan")), "kl_coef"),
])
def test_bad_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        PPOLoss(**kwargs)


def test_bad_inputs_name_the_argument():
    data = random_inputs(0)
    loss = PPOLoss(**full_config("token-mean"))
    cases = {
        "advantages": dict(data, advantages=data["advantages"][:, :3]),
        "loss_mask": dict(data, loss_mask=data["loss_mask"] * 2),
        "returns": dict(data, returns=None),
        "old_values": dict(data, old_values=None),
        "ref_logprobs": dict(data, ref_logprobs=None),
        "entropy": dict(data, entropy=None),
        "logprobs": dict(data, logprobs=data["logprobs"][0]),
    }
    for name, bad in cases.items():
        with pytest.raises(ValueError, match=name):
            call(loss, bad)
    with pytest.raises(ValueError, match="old_logprobs.*floating"):
        call(loss, dict(data, old_logprobs=data["old_logprobs"].long()))


def test_inputs_are_not_modified():
    data = random_inputs(2)
    copies = {k: v.clone() for k, v in data.items()}
    versions = {k: v._version for k, v in data.items()}
    call(PPOLoss(**full_config("seq-mean-token-mean", dual_clip=2.0)), data)
    for k in data:
        assert data[k]._version == versions[k] and torch.equal(data[k], copies[k]), k


def test_a_bool_mask_and_a_float32_batch_work():
    data = {k: v.float() for k, v in random_inputs(4).items()}
    as_bool = dict(data, loss_mask=data["loss_mask"].bool())
    cfg = full_config("token-mean")
    assert torch.allclose(call(PPOLoss(**cfg), as_bool)["loss"], call(PPOLoss(**cfg), data)["loss"])


# ---------------------------------------------------------------- the built-in trainer


def test_the_builtin_trainer_keeps_its_loss_and_metrics():
    """PPOModule's update (``module.updater.step``: PPOLoss and AdvantageMetrics) reproduces, minibatch by
    minibatch, the loss, gradients and loss metrics of the trainer's earlier hand-written
    clipped-surrogate loss, written out here as it was."""
    from lightning_adv import ActorConfig
    from lightning_adv.trainer.data import generator
    from lightning_adv.trainer.policies.logprobs import (
        entropy_of_logprobs, next_token_logprobs, scaled_log_softmax)
    from lightning_adv.trainer.policies.config import PolicyConfig
    from lightning_adv.trainer.ppo import PPOConfig, PPOModule

    class Recorder(PPOModule):
        """Records the loss and gradients of each minibatch; lr 0 keeps the weights fixed."""

        def optimizers(self):
            return self.sgd

        def manual_backward(self, loss):
            loss.backward()
            self.recorded.append((loss.detach().clone(),
                                  [p.grad.clone() for p in self.policy.parameters()]))

    ppo = PPOConfig(prompts_per_step=4, n_samples=3, epochs=1, minibatches=2, entropy_coef=0.05,
                    value_clip_eps=0.1, max_grad_norm=None)
    module = Recorder(actor=ActorConfig(kl_ctl=0.1, gae_lambda=0.95),
                      policy=PolicyConfig(d_model=16, n_layers=1, n_heads=2), ppo=ppo, seed=3)
    module.sgd, module.recorded = torch.optim.SGD(module.policy.parameters(), lr=0.0), []
    groups = module.rollout([0, 1, 2, 3], generator(3, "rollout", 0, 0))
    batch, meta = module.make_batch(groups)
    out = dict(module.advantage(batch, meta))
    g = torch.Generator().manual_seed(0)
    # off-policy old log-probs and values, so the clips bind
    out["logprobs"] = out["logprobs"] + 0.3 * torch.randn(out["logprobs"].shape, generator=g) * out["loss_mask"]
    batch = dict(batch, values=batch["values"] + 0.2 * torch.randn(batch["values"].shape, generator=g))
    minibatch_gen = torch.Generator().manual_seed(11)
    order = torch.randperm(len(batch["rewards"]), generator=torch.Generator().set_state(
        minibatch_gen.get_state()))
    module.updater.step(batch, out, minibatch_gen, module)
    logged = module.adv_metrics.compute()

    lengths = batch["attention_mask"].sum(1)
    assert len(module.recorded) == 2
    sums = {k: 0.0 for k in ("policy_loss", "entropy", "approx_kl", "clipfrac", "value_loss")}
    tokens = 0.0
    for chunk, (got_loss, got_grads) in zip(order.tensor_split(2), module.recorded):
        width = int(lengths[chunk].max())
        ids = batch["input_ids"][chunk, :width]
        m = out["loss_mask"][chunk, :width]
        module.policy.zero_grad()
        logits, values = module.policy(ids)
        log_ratio = (next_token_logprobs(logits, ids, ppo.temperature)
                     - out["logprobs"][chunk, :width]) * m
        ratio = log_ratio.exp()
        adv = out["advantages"][chunk, :width]
        pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - ppo.clip_eps, 1 + ppo.clip_eps))
        ent = entropy_of_logprobs(scaled_log_softmax(logits, ppo.temperature))
        ret, old_v = out["returns"][chunk, :width], batch["values"][chunk, :width]
        clipped = old_v + (values - old_v).clamp(-ppo.value_clip_eps, ppo.value_clip_eps)
        v_loss = 0.5 * torch.maximum((values - ret) ** 2, (clipped - ret) ** 2)
        n = m.sum()
        want = ((pg * m).sum() - ppo.entropy_coef * (ent * m).sum()
                + ppo.value_coef * (v_loss * m).sum()) / n
        want.backward()
        assert torch.allclose(got_loss, want.detach(), rtol=1e-6, atol=1e-7)
        for p, got in zip(module.policy.parameters(), got_grads):
            assert torch.allclose(got, p.grad, rtol=1e-5, atol=1e-7)
        with torch.no_grad():
            for name, x in (("policy_loss", pg), ("entropy", ent), ("value_loss", v_loss),
                            ("approx_kl", (ratio - 1) - log_ratio),
                            ("clipfrac", ((ratio - 1).abs() > ppo.clip_eps).float())):
                sums[name] += float((x * m).sum())
        tokens += float(n)
    assert 0 < sums["clipfrac"] < tokens
    for name, total in sums.items():
        assert logged[f"train/{name}"].item() == pytest.approx(total / tokens, rel=1e-5, abs=1e-7), name


# ---------------------------------------------------------------- DDP


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("loss_ddp")
    mp.spawn(workers.worker, args=(2, str(tmp / "init"), str(tmp / "rank0.pt")), nprocs=2, join=True)
    return torch.load(tmp / "rank0.pt", weights_only=True)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_ddp_gradients_equal_one_process_on_the_global_batch(ddp_results, mode):
    """Counts are all-reduced and the loss multiplied by the world size, so DDP's averaged
    gradient is the gradient of the global loss (the ranks hold 2 and 5 rows, unequal tokens)."""
    _, single = workers.loss_and_grads(workers.TinyPolicy(), workers.global_batch(), mode)
    for got, want in zip(ddp_results["grads"][mode], single):
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12), mode


def test_bfloat16_log_probs_count_tokens_exactly():
    """257 active tokens: bfloat16 would count 256; the loss is computed in float32."""
    lp = torch.zeros(1, 257, dtype=torch.bfloat16)
    adv = torch.ones(1, 257, dtype=torch.bfloat16)
    out = PPOLoss()(lp, lp, adv, torch.ones(1, 257))
    assert out["num_tokens"].item() == 257 and out["loss"].dtype == torch.float32
    assert out["loss"].item() == -1.0


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), tokens=st.integers(1, 5))
def test_modes_agree_when_every_sequence_has_the_same_tokens(seed, tokens):
    """n tokens in each of B rows: token-mean = seq-mean-token-mean = seq-mean-token-sum / n
    = seq-mean-token-sum-norm with the constant n = token-sum / (B * n)."""
    data = random_inputs(seed, rows=4, width=6)
    mask = torch.zeros(4, 6, dtype=torch.float64)
    for b in range(4):
        mask[b, torch.randperm(6, generator=torch.Generator().manual_seed(seed + b))[:tokens]] = 1
    data["loss_mask"] = mask
    losses = {mode: call(PPOLoss(**full_config(mode, loss_scale_factor=float(tokens))), data)["loss"].item()
              for mode in LOSS_AGG_MODES}
    assert losses["seq-mean-token-mean"] == pytest.approx(losses["token-mean"], rel=1e-10, abs=1e-12)
    assert losses["seq-mean-token-sum"] / tokens == pytest.approx(losses["token-mean"], rel=1e-10, abs=1e-12)
    assert losses["seq-mean-token-sum-norm"] == pytest.approx(losses["token-mean"], rel=1e-10, abs=1e-12)
    assert losses["token-sum"] / (4 * tokens) == pytest.approx(losses["token-mean"], rel=1e-10, abs=1e-12)
