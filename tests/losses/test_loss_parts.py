"""PPOLoss's parts beside the RL term (lightning_adv/losses/loss_parts.py): cross-entropy on
``ce_mask`` (ECHO's tool-output tokens) and KL to ``teacher_logprobs``, each a token mean
over its own tokens. Adding either leaves the RL term's value and gradient bit-identical;
the parts are computed by hand; micro-batches sum to the minibatch; bad inputs are named."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_adv import PPOLoss
from lightning_adv.losses.aggregation import LOSS_AGG_MODES, TokenCounts
from lightning_adv.losses.loss_parts import LossParts, PartInputs, add_loss_parts

#: generated tokens (the RL mask) and tool outputs (the cross-entropy mask), disjoint
MASK = torch.tensor([[0, 1, 1, 0, 0, 1, 0], [0, 1, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 0, 0]]).float()
TOOL = torch.tensor([[0, 0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]]).float()


def case(seed):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(MASK.shape, generator=g) * 2
    logprobs = (old - 0.3 * torch.randn(MASK.shape, generator=g)).clamp(max=0)
    logprobs = torch.where(MASK + TOOL > 0, logprobs, -math.inf)  # padding: never read
    return dict(old=old, logprobs=logprobs, advantages=torch.randn(MASK.shape, generator=g),
                teacher=-torch.rand(MASK.shape, generator=g) * 2,
                ref=-torch.rand(MASK.shape, generator=g) * 2,
                entropy=torch.rand(MASK.shape, generator=g))


def run(loss, data, **parts):
    logprobs = data["logprobs"].clone().requires_grad_()
    out = loss(logprobs, data["old"], data["advantages"], MASK, ref_logprobs=data["ref"],
               entropy=data["entropy"], **parts)
    grad, = torch.autograd.grad(out["loss"], logprobs)
    return out, grad


def parts_alone(parts, data, ce_mask=None, teacher=None):
    """The gradient of the parts on their own (no RL term) through the same function."""
    logprobs = data["logprobs"].clone().requires_grad_()
    total = add_loss_parts(torch.zeros(()), {}, parts, PartInputs(
        logprobs, MASK, TokenCounts(MASK, False), ce_mask, teacher))
    return torch.autograd.grad(total, logprobs)[0]


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2 ** 16), which=st.sampled_from(["ce", "teacher", "both"]))
def test_adding_a_part_leaves_the_rl_term_bit_identical(mode, seed, which):
    data = case(seed)
    settings_ = dict(loss_agg_mode=mode, kl_coef=0.05, entropy_coef=0.01,
                     loss_scale_factor=8.0 if mode == "seq-mean-token-sum-norm" else None)
    base, base_grad = run(PPOLoss(**settings_), data)
    ce = TOOL if which != "teacher" else None
    teacher = data["teacher"] if which != "ce" else None
    coefs = dict(ce_coef=0.3 if ce is not None else 0.0,
                 teacher_kl_coef=0.7 if teacher is not None else 0.0)
    loss = PPOLoss(**settings_, **coefs)
    out, grad = run(loss, data, ce_mask=ce, teacher_logprobs=teacher)
    assert torch.equal(out["rl_loss"], base["loss"].detach())
    for key in ("policy_loss", "kl_loss", "entropy", "num_tokens"):
        assert torch.equal(out[key], base[key]), key
    assert torch.equal(grad, base_grad + parts_alone(loss.parts, data, ce, teacher))
    # the cross-entropy gradient lives on the tool tokens only: the RL tokens' is the RL term's
    if teacher is None:
        assert torch.equal(grad * MASK, base_grad * MASK)
    assert torch.isfinite(out["loss"]) and torch.isfinite(grad).all()


def test_each_part_is_a_token_mean_over_its_own_tokens():
    data = case(1)
    loss = PPOLoss(ce_coef=0.3, teacher_kl_coef=0.7, teacher_kl_estimator="k1")
    out, grad = run(loss, data, ce_mask=TOOL, teacher_logprobs=data["teacher"])
    tool, gen = TOOL > 0, MASK > 0
    nll = -data["logprobs"][tool].mean()  # 4 tool tokens
    k1 = (data["logprobs"] - data["teacher"])[gen].mean()  # 10 generated tokens
    torch.testing.assert_close(out["ce_loss"], nll)
    torch.testing.assert_close(out["teacher_kl"], k1)
    assert out["ce_tokens"] == 4 and out["num_tokens"] == 10
    torch.testing.assert_close(out["loss"], out["rl_loss"] + 0.3 * nll + 0.7 * k1)
    # d/d log π of the parts: -0.3 / 4 on each tool token, +0.7 / 10 (k1) on each generated one
    base_grad = run(PPOLoss(), data)[1]
    extra = torch.where(tool, -0.3 / 4, 0.0) + torch.where(gen, 0.7 / 10, 0.0)
    torch.testing.assert_close(grad, base_grad + extra)


def test_the_part_does_not_depend_on_how_many_tokens_it_has():
    """Two copies of the batch side by side: the cross-entropy part (a mean over its own
    tokens) is the same, the RL term the same; a part normalised by the RL token count
    would double."""
    data = case(2)
    loss = PPOLoss(ce_coef=0.5)
    out, _ = run(loss, data, ce_mask=TOOL)
    doubled = {k: torch.cat([v, v]) for k, v in data.items()}
    mask2, tool2 = torch.cat([MASK, MASK]), torch.cat([TOOL, TOOL])
    out2 = loss(doubled["logprobs"], doubled["old"], doubled["advantages"], mask2,
                ref_logprobs=doubled["ref"], entropy=doubled["entropy"], ce_mask=tool2)
    torch.testing.assert_close(out2["ce_loss"], out["ce_loss"])
    torch.testing.assert_close(out2["loss"], out["loss"])


def test_micro_batches_with_the_minibatch_counts_sum_to_the_minibatch():
    data = case(3)
    loss = PPOLoss(ce_coef=0.3, teacher_kl_coef=0.2, loss_agg_mode="seq-mean-token-mean")
    whole, whole_grad = run(loss, data, ce_mask=TOOL, teacher_logprobs=data["teacher"])
    counts = loss.counts(MASK, ce_mask=TOOL)
    logprobs = data["logprobs"].clone().requires_grad_()
    total = 0.0
    for rows in (slice(0, 1), slice(1, 3)):
        total = total + loss(logprobs[rows], data["old"][rows], data["advantages"][rows],
                             MASK[rows], ref_logprobs=data["ref"][rows],
                             entropy=data["entropy"][rows], counts=counts,
                             ce_mask=TOOL[rows], teacher_logprobs=data["teacher"][rows])["loss"]
    grad, = torch.autograd.grad(total, logprobs)
    torch.testing.assert_close(total, whole["loss"])
    torch.testing.assert_close(grad, whole_grad)
    with pytest.raises(ValueError, match=r"PPOLoss counts: expected PPOLoss.counts\(loss_mask, "
                                         r"ce_mask=...\)"):
        loss(data["logprobs"][:1], data["old"][:1], data["advantages"][:1], MASK[:1],
             counts=loss.counts(MASK), ce_mask=TOOL[:1], teacher_logprobs=data["teacher"][:1])


def test_bad_inputs_are_named():
    data = case(4)
    args = (data["logprobs"], data["old"], data["advantages"], MASK)
    loss = PPOLoss(ce_coef=0.1, teacher_kl_coef=0.1)
    teacher = data["teacher"].clone()
    teacher[1, 4] = math.nan
    with pytest.raises(ValueError, match=r"PPOLoss teacher_logprobs: expected log-probs.*"
                                         r"loss mask's tokens, got '1 bad tokens \(first at \(1, 4\)"):
        loss(*args, ce_mask=TOOL, teacher_logprobs=teacher)
    teacher[1, 4] = -1.0
    teacher[0, 0] = math.inf  # outside the loss mask: never read
    loss(*args, ce_mask=TOOL, teacher_logprobs=teacher)
    logprobs = data["logprobs"].clone()
    logprobs[0, 3] = math.inf
    with pytest.raises(ValueError, match=r"PPOLoss logprobs: expected log-probs.*ce_mask's "
                                         r"tokens, got '1 bad tokens \(first at \(0, 3\)"):
        loss(logprobs, *args[1:], ce_mask=TOOL, teacher_logprobs=teacher)
    with pytest.raises(ValueError, match=r"PPOLoss ce_mask: expected only 0 and 1"):
        loss(*args, ce_mask=TOOL * 2, teacher_logprobs=teacher)
    with pytest.raises(ValueError, match=r"PPOLoss ce_mask: required with ce_coef > 0, got None"):
        loss(*args, teacher_logprobs=teacher)
    with pytest.raises(ValueError, match=r"PPOLoss teacher_logprobs: required with "
                                         r"teacher_kl_coef > 0"):
        loss(*args, ce_mask=TOOL)
    with pytest.raises(ValueError, match=r"PPOLoss ce_mask: expected shape \(3, 7\)"):
        loss(*args, ce_mask=TOOL[:, :5], teacher_logprobs=teacher)
    with pytest.raises(ValueError, match=r"ce_coef: expected a number >= 0.0, got -0.1"):
        PPOLoss(ce_coef=-0.1)
    with pytest.raises(ValueError, match=r"teacher_kl_estimator: expected one of"):
        PPOLoss(teacher_kl_estimator="k9")
    assert LossParts() == PPOLoss().parts
