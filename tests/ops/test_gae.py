"""The GAE ops against hand-computed numbers and against the reference loops, their
torch.library registration (opcheck) and torch.compile."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_adv.ops.gae import compute_token_gae, compute_turn_gae, validate_turn_ids
from lightning_adv.testing.reference_gae import token_gae_loop, turn_gae_loop, turn_gae_per_row

TOL = 1e-5


def assert_close(got, want, tol=TOL):
    """``|got - want| <= tol * max(|want|, 1)`` elementwise, same shape and dtype."""
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype,
                                                                 want.shape, want.dtype)
    assert bool(torch.isfinite(got).all())
    if got.numel():
        err = (got.double() - want.double()).abs() / want.double().abs().clamp_min(1.0)
        assert err.max().item() <= tol, f"max rel err {err.max().item():.3g}"


def t(*rows, dtype=torch.float32):
    return torch.tensor(rows, dtype=dtype)


# ---------------------------------------------------------------------------- by hand


def test_token_gae_masked_gap_by_hand():
    # γ = 0.5, λ = 0.5 (γλ = 0.25); mask 0 1 0 1 1 0: a gap at t=2; EOS row, bootstrap 0.
    rewards = t([0.0, 1.0, 0.0, 0.0, 2.0, 0.0])
    values = t([0.5, 1.0, 7.0, 2.0, 4.0, 9.0])
    mask = t([0, 1, 0, 1, 1, 0])
    adv, ret = compute_token_gae(rewards, values, mask, bootstrap_values=t(0.0),
                                 discount=0.5, gae_lambda=0.5)
    # t=5: last column, 0.
    # t=4: δ = 2 + 0.5*0 (bootstrap) - 4 = -2;            A = -2
    # t=3: δ = 0 + 0.5*4 (V4) - 2 = 0;                      A = 0 + 0.25*(-2) = -0.5
    # t=2: inactive, carries A3 = -0.5 (its value 7 is never a target)
    # t=1: δ = 1 + 0.5*2 (V3, the next active) - 1 = 1;     A = 1 + 0.25*(-0.5) = 0.875
    # t=0: inactive, carries 0.875
    assert_close(adv, t([0.875, 0.875, -0.5, -0.5, -2.0, 0.0]))
    assert_close(ret, t([1.375, 1.875, 6.5, 1.5, 2.0, 9.0]))  # adv + values


def test_token_gae_truncated_row_bootstraps_by_hand():
    # γ = 1, λ = 0.5; truncated row: bootstrap = 5 (value after the last valid token).
    rewards, values = t([0.0, 0.0, 1.0, 0.0]), t([0.0, 2.0, 3.0, 5.0])
    adv, ret = compute_token_gae(rewards, values, t([0, 1, 1, 0]), bootstrap_values=t(5.0),
                                 discount=1.0, gae_lambda=0.5)
    # t=2: δ = 1 + 5 - 3 = 3;  A = 3
    # t=1: δ = 0 + 3 - 2 = 1;  A = 1 + 0.5*3 = 2.5
    # t=0: carries 2.5
    assert_close(adv, t([2.5, 2.5, 3.0, 0.0]))
    assert_close(ret, t([2.5, 4.5, 6.0, 5.0]))


def test_token_gae_per_row_lambda_by_hand():
    # Same row twice, γ = 1, λ = [1, 0]; mask 0 1 1 0, EOS.
    rewards = t([0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0])
    values = t([0.0, 1.0, 2.0, 0.0], [0.0, 1.0, 2.0, 0.0])
    mask = t([0, 1, 1, 0], [0, 1, 1, 0])
    adv, _ = compute_token_gae(rewards, values, mask, bootstrap_values=t(0.0, 0.0),
                               discount=1.0, gae_lambda=torch.tensor([1.0, 0.0]))
    # t=2: δ = 1 + 0 - 2 = -1 in both rows.   t=1: δ = 0 + 2 - 1 = 1.
    # λ=1: A1 = 1 + (-1) = 0.                 λ=0: A1 = 1.
    assert_close(adv, t([0.0, 0.0, -1.0, 0.0], [1.0, 1.0, -1.0, 0.0]))


def test_token_gae_last_column_is_never_a_timestep():
    # An active flag in column T-1 is ignored: t=1 bootstraps (4), not V2 = 100.
    adv, _ = compute_token_gae(t([0.0, 1.0, 0.0]), t([0.0, 2.0, 100.0]), t([0, 1, 1]),
                               bootstrap_values=t(4.0), discount=1.0, gae_lambda=1.0)
    assert_close(adv, t([3.0, 3.0, 0.0]))  # δ1 = 1 + 4 - 2


def test_python_lambda_is_applied_at_float32_precision():
    # One reward of 1 at t = T-2, values 0, γ = 1: A_t = c**(T-2-t) with c the float32
    # number nearest 0.9999, as the legacy loop multiplies its float32 advantages by it.
    width = 3002
    rewards = torch.zeros(1, width)
    rewards[0, -2] = 1.0
    mask = torch.ones(1, width)
    mask[0, 0] = 0
    adv, _ = compute_token_gae(rewards, torch.zeros(1, width), mask,
                               bootstrap_values=torch.zeros(1), discount=1.0, gae_lambda=0.9999)
    c = float(torch.tensor(0.9999, dtype=torch.float32))  # 0.99989998...
    # t = 1 .. T-2: c**(T-2-t); t = 0 (prompt) carries t = 1; t = T-1 gets 0.
    exponents = (width - 2 - torch.arange(width, dtype=torch.float64)).clamp(max=width - 3)
    want = c ** exponents
    want[-1] = 0.0
    assert_close(adv, want[None].float())
    assert abs(adv[0, 0].item() - 0.9999 ** 3000) > 1e-5  # the unrounded λ would differ


def test_turn_gae_gaps_and_adjacent_turns_by_hand():
    # Turn ids 0 0 | 2 2 3 (id 1 skipped; turns 2 and 3 adjacent); γ = 1, λ = 0.5.
    # Row 1 is the same data, truncated with bootstrap 4 and λ = 0.
    rewards = t([0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0])
    values = t([0.0, 1.0, 5.0, 9.0, 2.0, 7.0, 3.0, 0.0])
    mask = t([0, 1, 1, 0, 1, 1, 1, 0])
    ids = torch.tensor([[-1, 0, 0, -1, 2, 2, 3, -1]] * 2)
    adv, ret = compute_turn_gae(rewards.repeat(2, 1), values.repeat(2, 1), mask.repeat(2, 1),
                                ids, bootstrap_values=t(0.0, 4.0), discount=1.0,
                                gae_lambda=torch.tensor([0.5, 0.0]))
    # Turn rewards: R0 = 1 + 0, R2 = 0 + 0, R3 = 2. Turn values (first token): V0 = 1, V2 = 2, V3 = 3.
    # Row 0: turn 3: δ = 2 + 0 - 3 = -1, A = -1
    #        turn 2: δ = 0 + 3 - 2 = 1,  A = 1 + 0.5*(-1) = 0.5
    #        turn 0: δ = 1 + 2 - 1 = 2,  A = 2 + 0.5*0.5 = 2.25
    # Row 1: turn 3: δ = 2 + 4 - 3 = 3; turn 2: δ = 1; turn 0: δ = 2 (λ = 0: A = δ).
    assert_close(adv, t([0, 2.25, 2.25, 0, 0.5, 0.5, -1, 0], [0, 2, 2, 0, 1, 1, 3, 0]))
    # Returns: A + turn value on active tokens, the token's value elsewhere.
    assert_close(ret, t([0, 3.25, 3.25, 9, 2.5, 2.5, 2, 0], [0, 3, 3, 9, 3, 3, 6, 0]))


def test_rows_without_active_tokens():
    rewards, values = torch.randn(2, 5), torch.randn(2, 5)
    mask = torch.zeros(2, 5)
    ids = torch.full((2, 5), -1)
    adv, ret = compute_token_gae(rewards, values, mask, bootstrap_values=torch.ones(2),
                                 discount=1.0, gae_lambda=0.9)
    assert_close(adv, torch.zeros(2, 5))
    assert_close(ret, values)
    adv, ret = compute_turn_gae(rewards, values, mask, ids, bootstrap_values=torch.ones(2),
                                discount=1.0, gae_lambda=0.9)
    assert_close(adv, torch.zeros(2, 5))
    assert_close(ret, values)


@pytest.mark.parametrize("bs, width", [(0, 5), (3, 1), (2, 2)])
@pytest.mark.parametrize("gae_lambda", [0.9, 1.0, 0.0, "tensor"])
def test_degenerate_shapes_match_loop(bs, width, gae_lambda):
    gen = torch.Generator().manual_seed(bs * 10 + width)
    rewards, values = torch.randn(bs, width, generator=gen), torch.randn(bs, width, generator=gen)
    mask, ids = torch.ones(bs, width), torch.zeros(bs, width, dtype=torch.long)
    lam = torch.rand(bs, generator=gen) if gae_lambda == "tensor" else gae_lambda
    kwargs = dict(bootstrap_values=torch.randn(bs, generator=gen), discount=0.9, gae_lambda=lam)
    for got, want in zip(compute_token_gae(rewards, values, mask, **kwargs),
                         token_gae_loop(rewards, values, mask, **kwargs)):
        assert_close(got, want)
    for got, want in zip(compute_turn_gae(rewards, values, mask, ids, **kwargs),
                         turn_gae_loop(rewards, values, mask, ids, **kwargs)):
        assert_close(got, want)


# ---------------------------------------------------------------------------- random batches


def random_mask(gen: torch.Generator, bs: int, width: int) -> torch.Tensor:
    """Rows of ``prompt | (generated | gap)* | padding``, some rows all zero, some random."""
    mask = torch.zeros(bs, width)
    for b in range(bs):
        kind = int(torch.randint(0, 6, (), generator=gen))
        if kind == 0:
            continue  # no active token
        if kind == 1:
            mask[b] = (torch.rand(width, generator=gen) < 0.5).float()
            continue
        pos = int(torch.randint(0, max(1, width // 3), (), generator=gen))
        end = int(torch.randint(pos, width + 1, (), generator=gen))
        while pos < end:
            run = int(torch.randint(1, max(2, width // 4), (), generator=gen))
            mask[b, pos:min(pos + run, end)] = 1
            pos += run + int(torch.randint(0, 4, (), generator=gen))
    return mask


def random_turn_ids(gen: torch.Generator, mask: torch.Tensor) -> torch.Tensor:
    """Non-decreasing ids on active tokens (gaps in numbering, adjacent turns), -1 off it."""
    bs, width = mask.shape
    step = (torch.rand(bs, width, generator=gen) < 0.1).long()
    step *= torch.randint(1, 3, (bs, width), generator=gen)
    ids = torch.cumsum(step, dim=1).clamp(max=width - 1)
    return torch.where(mask.bool(), ids, -1)


coefficients = st.one_of(st.just(0.0), st.just(1.0), st.floats(0.0, 1.0, exclude_min=True,
                                                               exclude_max=True))


@st.composite
def lambdas(draw, bs):
    """A float λ, or a per-row λ tensor mixing 0, 1, tiny and ordinary values."""
    if draw(st.booleans()):
        return draw(coefficients)
    choices = st.one_of(coefficients, st.just(1e-7), st.floats(1e-6, 1e-3))
    return torch.tensor([draw(choices) for _ in range(bs)], dtype=torch.float32)


@st.composite
def batches(draw, max_width=48, min_width=2, max_rows=4):
    bs = draw(st.integers(1, max_rows))
    width = draw(st.integers(min_width, max_width))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    mask = random_mask(gen, bs, width)
    scale = draw(st.sampled_from([0.1, 1.0, 10.0]))
    return dict(
        rewards=torch.randn(bs, width, generator=gen) * scale,
        values=torch.randn(bs, width, generator=gen) * scale,
        loss_mask=mask,
        turn_ids=random_turn_ids(gen, mask),
        bootstrap=torch.randn(bs, generator=gen) * (torch.rand(bs, generator=gen) < 0.5),
        discount=draw(coefficients),
        gae_lambda=draw(lambdas(bs)),
    )


def _as(x, dtype):
    return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def run_token(fn, b, dtype=torch.float32):
    return fn(_as(b["rewards"], dtype), _as(b["values"], dtype), b["loss_mask"],
              bootstrap_values=_as(b["bootstrap"], dtype), discount=b["discount"],
              gae_lambda=b["gae_lambda"])


def run_turn(fn, b, dtype=torch.float32):
    return fn(_as(b["rewards"], dtype), _as(b["values"], dtype), b["loss_mask"], b["turn_ids"],
              bootstrap_values=_as(b["bootstrap"], dtype), discount=b["discount"],
              gae_lambda=b["gae_lambda"])


@settings(max_examples=400, deadline=None)
@given(batches())
def test_token_gae_matches_loop(b):
    for got, want in zip(run_token(compute_token_gae, b), run_token(token_gae_loop, b)):
        assert_close(got, want)


@settings(max_examples=400, deadline=None)
@given(batches())
def test_turn_gae_matches_loops(b):
    want = run_turn(turn_gae_loop, b)
    for got, ref in zip(run_turn(compute_turn_gae, b), want):
        assert_close(got, ref)
    for got, ref in zip(run_turn(turn_gae_per_row, b), want):
        assert_close(got, ref)


@settings(max_examples=30, deadline=None)
@given(batches(max_width=48), st.sampled_from([torch.float64, torch.bfloat16]))
def test_other_dtypes_match_loop(b, dtype):
    for got, want in zip(run_token(compute_token_gae, b, dtype), run_token(token_gae_loop, b, dtype)):
        assert_close(got, want)
    for got, want in zip(run_turn(compute_turn_gae, b, dtype), run_turn(turn_gae_loop, b, dtype)):
        assert_close(got, want)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches(max_width=3000, min_width=500, max_rows=2))
def test_long_rows_match_loop_in_float64(b):
    """Thousands of steps, many chunks for small γλ; float64 so the loop itself is exact."""
    for got, want in zip(run_token(compute_token_gae, b, torch.float64),
                         run_token(token_gae_loop, b, torch.float64)):
        assert_close(got, want)
    for got, want in zip(run_turn(compute_turn_gae, b, torch.float64),
                         run_turn(turn_gae_loop, b, torch.float64)):
        assert_close(got, want)


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches(max_width=3000, min_width=500, max_rows=2), st.sampled_from([0.0, 1.0]))
def test_long_float32_rows_match_exact_sums(b, discount):
    """Float32 inputs over thousands of steps against the loop run in float64.

    Inputs on a 1/64 grid and γ in {0, 1} make every δ exact in float32, so the float64
    loop is the exact answer for the same float32 γλ: this checks the kernel's own
    accumulation, which the float32 loop (error ~ sqrt(T)·eps·|δ|) cannot.
    """
    b = dict(b, discount=discount, rewards=(b["rewards"] * 64).round() / 64,
             values=(b["values"] * 64).round().clamp(-512, 512) / 64,
             bootstrap=(b["bootstrap"] * 64).round() / 64)
    lam = b["gae_lambda"]
    # The kernels apply a Python γλ to float32 tensors at float32 precision; give the
    # float64 loop that same number.
    lam64 = lam if isinstance(lam, torch.Tensor) else float(torch.tensor(lam, dtype=torch.float32))
    got = run_token(compute_token_gae, b)
    want = run_token(token_gae_loop, dict(b, gae_lambda=lam64), torch.float64)
    for g, w in zip(got, want):
        assert_close(g.double(), w)


@pytest.mark.parametrize("gae_lambda", [
    0.05, 1e-6, 0.0, 1.0,
    torch.tensor([0.05, 0.0, 1e-6, 1.0]),   # per row, the extremes side by side
])
def test_long_rows_and_extreme_lambdas_match_loop(gae_lambda):
    """1,500 steps with γλ from 0 to 1: the doubling scan's products shrink to 0 without
    overflowing, and every row agrees with the loop."""
    gen = torch.Generator().manual_seed(3)
    bs, width = 4, 1500
    mask = random_mask(gen, bs, width)
    mask[:, 100:1400] = 1
    rewards, values = torch.randn(bs, width, generator=gen), torch.randn(bs, width, generator=gen)
    args = (rewards.double(), values.double(), mask)
    lam = gae_lambda.double() if isinstance(gae_lambda, torch.Tensor) else gae_lambda
    kwargs = dict(bootstrap_values=torch.randn(bs, generator=gen).double(), discount=1.0,
                  gae_lambda=lam)
    for got, want in zip(compute_token_gae(*args, **kwargs), token_gae_loop(*args, **kwargs)):
        assert_close(got, want)


def op_samples():
    """Arguments of both ops as the public functions pass them (float32 and float64, a
    per-row λ, an empty batch)."""
    gen = torch.Generator().manual_seed(7)
    samples = []
    for dtype, bs, width in ((torch.float32, 3, 17), (torch.float64, 2, 5), (torch.float32, 0, 4)):
        mask = random_mask(gen, bs, width).to(dtype) if bs else torch.zeros(bs, width, dtype=dtype)
        ids = random_turn_ids(gen, mask.bool()) if bs else torch.zeros(bs, width, dtype=torch.long)
        rewards = torch.randn(bs, width, generator=gen, dtype=dtype)
        values = torch.randn(bs, width, generator=gen, dtype=dtype)
        boot = torch.randn(bs, generator=gen, dtype=dtype)
        lam = torch.rand(bs, generator=gen, dtype=torch.float64)
        samples.append(((rewards, values, mask, boot, 0.9, lam, dtype),
                        (rewards, values, mask, ids.long(), boot, 0.9, lam, dtype)))
    return samples


@pytest.mark.parametrize("sample", op_samples())
def test_ops_pass_opcheck(sample):
    """The registrations (schema, fake implementations, no aliasing, dispatch under
    torch.compile's AOT tracing) hold for both ops."""
    token_args, turn_args = sample
    torch.library.opcheck(torch.ops.lightning_adv.token_gae.default, token_args)
    torch.library.opcheck(torch.ops.lightning_adv.turn_gae.default, turn_args)


def test_compiled_full_graph_gives_the_eager_numbers():
    """``compute_token_gae`` traces into one graph (its checks are static, the op opaque
    with a fake implementation: no host sync breaks the graph) and computes the eager
    numbers."""
    gen = torch.Generator().manual_seed(11)
    b = next_batch(gen, bs=4, width=33)

    def advantages(rewards, values, mask, boot):
        adv, ret = compute_token_gae(rewards, values, mask, bootstrap_values=boot,
                                     discount=0.95, gae_lambda=0.9)
        return adv * 2, ret

    args = (b["rewards"], b["values"], b["loss_mask"].float(), b["bootstrap"])
    compiled = torch.compile(advantages, fullgraph=True)  # inductor, as users compile
    for got, want in zip(compiled(*args), advantages(*args)):
        assert torch.equal(got, want)


def test_compiled_turn_gae_gives_the_eager_numbers():
    gen = torch.Generator().manual_seed(12)
    b = next_batch(gen, bs=3, width=21)

    def advantages(rewards, values, mask, ids, boot):
        return compute_turn_gae(rewards, values, mask, ids, bootstrap_values=boot,
                                discount=1.0, gae_lambda=0.8)

    args = (b["rewards"], b["values"], b["loss_mask"].float(), b["turn_ids"], b["bootstrap"])
    compiled = torch.compile(advantages, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(*args), advantages(*args)):
        assert torch.equal(got, want)


def test_inputs_are_not_modified():
    gen = torch.Generator().manual_seed(0)
    b = next_batch(gen)
    before = {k: v.clone() for k, v in b.items() if isinstance(v, torch.Tensor)}
    run_token(compute_token_gae, b)
    run_turn(compute_turn_gae, b)
    for k, v in before.items():
        assert torch.equal(b[k], v), k


def next_batch(gen, bs=3, width=40):
    mask = random_mask(gen, bs, width)
    return dict(rewards=torch.randn(bs, width, generator=gen),
                values=torch.randn(bs, width, generator=gen), loss_mask=mask.bool(),
                turn_ids=random_turn_ids(gen, mask), bootstrap=torch.randn(bs, generator=gen),
                discount=0.9, gae_lambda=torch.rand(bs, generator=gen))


@pytest.mark.cuda
def test_cuda_matches_cpu():
    assert torch.cuda.is_available(), "run with -m cuda on a machine with a CUDA device"
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        b = next_batch(gen, bs=8, width=700)
        cuda = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in b.items()}
        for fn, run in ((compute_token_gae, run_token), (compute_turn_gae, run_turn)):
            for got, want in zip(run(fn, cuda), run(fn, b)):
                assert got.device.type == "cuda"
                assert_close(got.cpu(), want)


# ---------------------------------------------------------------------------- validation


def kernel_args(bs=2, width=5):
    return (torch.zeros(bs, width), torch.zeros(bs, width), torch.ones(bs, width))


@pytest.mark.parametrize("fn", ["token", "turn"])
def test_shape_and_device_errors(fn):
    def call(rewards, values, mask, boot=torch.zeros(2), lam=0.9, ids=None):
        if fn == "token":
            return compute_token_gae(rewards, values, mask, bootstrap_values=boot, discount=1.0,
                                     gae_lambda=lam)
        ids = torch.zeros(mask.shape, dtype=torch.long) if ids is None else ids
        return compute_turn_gae(rewards, values, mask, ids, bootstrap_values=boot, discount=1.0,
                                gae_lambda=lam)

    r, v, m = kernel_args()
    with pytest.raises(ValueError, match=r"rewards must be a \[B, T\] tensor"):
        call(torch.zeros(5), v, m)
    with pytest.raises(ValueError, match=r"values must have shape \[2, 5\]"):
        call(r, torch.zeros(2, 4), m)
    with pytest.raises(ValueError, match=r"loss_mask must have shape \[2, 5\]"):
        call(r, v, torch.ones(3, 5))
    with pytest.raises(ValueError, match=r"bootstrap_values must have shape \[2\]"):
        call(r, v, m, boot=torch.zeros(3))
    with pytest.raises(ValueError, match=r"a gae_lambda tensor must have shape \[2\]"):
        call(r, v, m, lam=torch.ones(3))
    with pytest.raises(ValueError, match=r"values is on meta"):
        call(r, torch.zeros(2, 5, device="meta"), m)
    with pytest.raises(ValueError, match=r"bootstrap_values is on meta"):
        call(r, v, m, boot=torch.zeros(2, device="meta"))
    with pytest.raises(ValueError, match=r"gae_lambda is on meta"):
        call(r, v, m, lam=torch.ones(2, device="meta"))


@pytest.mark.parametrize("ids, message", [
    ([[-1, 0, -1, 1, 1]], "must be non-negative"),
    ([[-1, 0, 0, 5, 5]], "smaller than the sequence length 5"),
    ([[-1, 2, 2, 1, 1]], "non-decreasing"),
])
def test_turn_id_errors(ids, message):
    r, v, _ = kernel_args(1)
    mask = torch.tensor([[0.0, 1, 1, 1, 1]])
    with pytest.raises(ValueError, match=f"compute_turn_gae: turn_ids .*{message}.*rows \\[0\\]"):
        compute_turn_gae(r, v, mask, torch.tensor(ids), bootstrap_values=torch.zeros(1),
                         discount=1.0, gae_lambda=1.0)


def test_validate_turn_ids_rules():
    active = torch.tensor([[False, True, True, False, True, True]])
    validate_turn_ids(active, torch.tensor([[-1, 0, 0, -1, 3, 4]]))     # gaps, adjacent turns
    validate_turn_ids(active, torch.tensor([[9, 2, 2, -5, 2, 2]]))      # one turn; junk off it
    for ids, message in (([[-1, 0, -2, -1, 1, 1]], "non-negative"),
                         ([[-1, 0, 0, -1, 6, 6]], "smaller than the sequence length 6"),
                         ([[-1, 1, 1, -1, 0, 2]], "non-decreasing"),
                         ([[-1, 0, 1, -1, 0, 1]], "non-decreasing")):
        with pytest.raises(ValueError, match=f"where: turn_ids .*{message}"):
            validate_turn_ids(active, torch.tensor(ids), where="where")


def test_turn_id_dtype_and_shape_errors():
    r, v, m = kernel_args()
    kwargs = dict(bootstrap_values=torch.zeros(2), discount=1.0, gae_lambda=1.0)
    with pytest.raises(ValueError, match="integer dtype"):
        compute_turn_gae(r, v, m, torch.zeros(2, 5), **kwargs)
    with pytest.raises(ValueError, match=r"turn_ids must have shape \[2, 5\]"):
        compute_turn_gae(r, v, m, torch.zeros(2, 4, dtype=torch.long), **kwargs)


def test_inactive_positions_may_hold_any_turn_id():
    r, v, _ = kernel_args(1)
    mask = torch.tensor([[0.0, 1, 1, 0, 0]])
    ids = torch.tensor([[-7, 0, 0, 99, -1]])
    adv, _ = compute_turn_gae(r + 1, v, mask, ids, bootstrap_values=torch.zeros(1), discount=1.0,
                              gae_lambda=1.0)
    assert_close(adv, torch.tensor([[0.0, 2.0, 2.0, 0.0, 0.0]]))
