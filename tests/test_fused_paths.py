"""The fused fast paths against the plain computations they replace: the combined mask
checks, the aligned loss mask at both sizes, token advantage normalization, the alignment
helpers and the cached grouping index."""

from __future__ import annotations

import contextlib
import pickle

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_adv import BatchMeta, NormConfig, RolloutGroup
from lightning_adv import alignment, batch_checks, native, normalization
from lightning_adv.batch_checks import _MaskChecks, _explain_mask_error, aligned_loss_mask

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DTYPES = [torch.bool, torch.int32, torch.int64, torch.float32, torch.float64]


@st.composite
def mask_pairs(draw):
    """Attention and loss masks, mostly valid, sometimes broken in one of the ways SPEC §1
    forbids (values other than 0/1, gaps, generated padding, a generated column 0)."""
    rows, width = draw(st.integers(1, 5)), draw(st.integers(2, 12))
    lengths = [draw(st.integers(1, width)) for _ in range(rows)]
    att = torch.zeros(rows, width)
    loss = torch.zeros(rows, width)
    for r, n in enumerate(lengths):
        att[r, :n] = 1
        for t in range(1, n):
            loss[r, t] = float(draw(st.booleans()))
    fault = draw(st.sampled_from(["none", "none", "value", "gap", "outside", "column0", "nan"]))
    r, t = draw(st.integers(0, rows - 1)), draw(st.integers(0, width - 1))
    target = draw(st.sampled_from(["att", "loss"]))
    if fault == "value":
        (att if target == "att" else loss)[r, t] = draw(st.sampled_from([2.0, -1.0, 0.5, 3.0]))
    elif fault == "gap" and lengths[r] >= 2:
        att[r, draw(st.integers(0, lengths[r] - 2))] = 0
    elif fault == "outside":
        loss[r, t] = 1
    elif fault == "column0":
        loss[r, 0] = 1
    elif fault == "nan":
        (att if target == "att" else loss)[r, t] = float("nan")
    dtypes = draw(st.tuples(st.sampled_from(DTYPES), st.sampled_from(DTYPES)))
    cast = []
    for x, dtype in zip((att, loss), dtypes):
        if dtype == torch.bool or not dtype.is_floating_point:
            x = torch.nan_to_num(x, nan=5.0)
            x = x.round() if dtype != torch.bool else x
        cast.append(x.to(dtype))
    return cast[0], cast[1]


def outcome(fn):
    try:
        return ("ok", fn())
    except ValueError as exc:
        return ("error", str(exc))


@SETTINGS
@given(mask_pairs())
def test_combined_mask_checks_decide_as_the_checks_one_by_one(masks):
    attention, loss = masks
    checks = _MaskChecks(attention, loss)
    values = torch.stack(checks.reductions).tolist()
    fast = outcome(lambda: checks.check(values))
    exact = outcome(lambda: _explain_mask_error(attention, loss))
    assert fast[0] == exact[0]
    if fast[0] == "error":
        assert fast[1] == exact[1]
    else:
        lengths, aligned = fast[1]
        assert torch.equal(lengths, attention.double().sum(1).long())
        assert torch.equal(aligned, torch.roll(loss.float(), -1, dims=1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_aligned_loss_mask_is_the_rolled_mask_at_both_sizes(dtype, monkeypatch):
    loss = (torch.rand(8, 300) < 0.5).to(dtype)
    want = torch.roll(loss, -1, dims=1).float()
    assert torch.equal(aligned_loss_mask(loss), want)
    monkeypatch.setattr(batch_checks, "SMALL", 0)  # the one-pass variant for big batches
    got = aligned_loss_mask(loss)
    assert torch.equal(got, want) and got.dtype == torch.float32


@pytest.mark.parametrize("small", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_masked_shift_is_roll_then_multiply(dtype, small, monkeypatch):
    if not small:
        monkeypatch.setattr(alignment, "SMALL", 0)  # the one-pass variant for big batches
    x = torch.randn(6, 40).to(dtype)
    mask = (torch.rand(6, 40) < 0.5).float()
    want = torch.roll(x, -1, dims=-1).mul_(mask)
    got = alignment._masked_shift(x, mask)
    assert got.dtype == want.dtype and torch.equal(got, want)
    assert got.data_ptr() != x.data_ptr()


def reference_normalize(x, config, mask, sizes, members):
    """The float64 formula (affine_parameters), as :func:`normalize` computes it for
    inputs the token fast path does not take."""
    if not bool(mask.any()):
        return x.float()
    mean, scale = normalization.affine_parameters(x, config, mask, sizes, members)
    return ((x - mean) * mask / scale).float()


def kernel_path(path):
    """The native loops (moments and affine map) or the torch passes."""
    return contextlib.nullcontext() if path == "native" else native.disabled()


@pytest.mark.parametrize("path", ["native", "torch"])
@SETTINGS
@given(st.integers(1, 6), st.integers(1, 30), st.sampled_from(["batch", "group", None]),
       st.sampled_from(["batch", "group", None]), st.booleans(), st.floats(1e-8, 1e-2),
       st.floats(0.01, 100.0), st.floats(-50.0, 50.0), st.integers(0, 2**31 - 1))
def test_token_normalization_matches_the_float64_formula(path, groups, width, mean_level,
                                                         std_level, unbiased, eps, spread,
                                                         offset, seed):
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 4, (groups,), generator=gen).tolist()
    rows = sum(sizes)
    x = (torch.randn(rows, width, generator=gen) * spread + offset)
    mask = (torch.rand(rows, width, generator=gen) < 0.6).float()
    members = [max(1, s - int(torch.randint(0, 2, (), generator=gen))) for s in sizes]
    config = NormConfig(mean_level=mean_level, std_level=std_level, std_unbiased=unbiased, eps=eps)
    with kernel_path(path):
        got = normalization.normalize(x, config, mask, sizes, members)
    want = reference_normalize(x, config, mask, sizes, members)
    assert got.dtype == want.dtype == torch.float32
    # float32 statistics: a few ulps of (x - mean) / std, relative to the magnitudes involved
    scale = (x.abs().max() + abs(offset) + 1) / (x[mask > 0].std() if mask.sum() > 1 else 1)
    tol = 2e-6 * float(scale) + 1e-6
    assert torch.allclose(got, want, rtol=1e-5, atol=tol), float((got - want).abs().max())


@pytest.mark.parametrize("path", ["native", "torch"])
@pytest.mark.parametrize("level", ["batch", "group"])
@pytest.mark.parametrize("value", [-1.5125, 0.1, 3.0e4])
def test_token_normalization_of_equal_values_is_exactly_zero(path, level, value):
    # std 0: (x - mean) / eps, so the mean must be the value exactly (a float32 sum's
    # rounding error would come out multiplied by 1/eps = 1e5)
    mask = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0]).repeat(4, 1)  # 3 a row
    x = torch.where(mask > 0, value, torch.randn(4, 7))
    with kernel_path(path):
        out = normalization.normalize(x, NormConfig(mean_level=level, std_level=level), mask,
                                      [2, 2], [2, 2])
    assert torch.equal(out, torch.zeros(4, 7)), out


@pytest.mark.parametrize("path", ["native", "torch"])
@pytest.mark.parametrize("mean_level", ["batch", "group", None])
def test_token_normalization_of_an_empty_mask_returns_the_input(path, mean_level):
    x = torch.randn(3, 5)
    with kernel_path(path):
        out = normalization.normalize(x, NormConfig(mean_level=mean_level), torch.zeros(3, 5))
    assert torch.equal(out, x)


def test_meta_index_is_built_once_and_follows_changes():
    meta = BatchMeta(n_trajs=2, traj_group_sizes=[2, 3],
                     rollout_groups=[RolloutGroup((1, 1)), RolloutGroup((2, 1), (0.5, None))])
    cpu = torch.device("cpu")
    first = meta.index(cpu)
    assert meta.index(cpu) is first  # cached
    assert first.traj_of_row.tolist() == [0, 0, 1, 1, 1]
    assert first.rollout_of_row.tolist() == [0, 1, 2, 2, 3]
    assert first.rollout_starts.tolist() == [0, 1, 2, 4]
    assert first.explicit_supplied.tolist() == [False, False, True, False]
    assert first.any_explicit and first.explicit_rewards.tolist() == [0.0, 0.0, 0.5, 0.0]
    # BatchMeta is frozen but its lists are not: a changed grouping gets a new index
    meta.rollout_groups[1] = RolloutGroup((1, 1, 1))
    second = meta.index(cpu)
    assert second is not first and second.rollout_of_row.tolist() == [0, 1, 2, 3, 4]
    assert not second.any_explicit
    meta.traj_group_sizes[0] = 2  # same content: the same index
    assert meta.index(cpu) is second
    restored = pickle.loads(pickle.dumps(meta))
    assert "_index_cache" not in restored.__dict__ and restored == meta
    assert restored.index(cpu).rollout_of_row.tolist() == [0, 1, 2, 3, 4]


def test_group_index_cache_checks_member_counts():
    with pytest.raises(normalization.GroupingError, match="member counts"):
        normalization._group_index((2, 2), (1,), torch.device("cpu"))
