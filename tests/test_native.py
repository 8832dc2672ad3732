"""How lightning_adv.native loads its library and when the package uses it (the loops'
numbers are tested against the torch kernels and the reference loops in test_kernels.py,
test_fused_pipeline.py and test_fused_paths.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from lightning_adv import compute_token_gae, compute_turn_gae, native


def test_library_loads_and_matches_this_package():
    assert native.available(), native.STATUS
    assert native._LIB.la_abi_version() == native.ABI_VERSION
    assert native.STATUS.startswith("on (")


def test_a_library_of_another_version_is_not_used(monkeypatch):
    monkeypatch.setattr(native, "ABI_VERSION", native.ABI_VERSION + 1)
    lib, status = native._load()
    assert lib is None and "another version of _native.c" in status and "pip install" in status


def test_the_environment_turns_it_off():
    code = "from lightning_adv import native; print(native.available(), native.STATUS)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"LIGHTNING_ADV_NATIVE": "0", "PATH": ""}).stdout
    assert out.startswith("False off (LIGHTNING_ADV_NATIVE=0)")


def test_disabled_is_a_block_and_nests():
    assert native.active()
    with native.disabled():
        assert not native.active()
        with native.disabled():
            assert not native.active()
        assert not native.active()
    assert native.active()


def test_which_tensors_the_kernel_loop_takes(monkeypatch):
    """CPU float32/float64 inputs and the mask dtypes it reads; the rest (half precision,
    a float64 λ over float32 inputs, int16 masks) goes through torch, with the same
    numbers."""
    calls = []
    loop = native.token_gae
    monkeypatch.setattr(native, "token_gae", lambda *a: calls.append(1) or loop(*a))
    gen = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(3, 6, generator=gen), torch.randn(3, 6, generator=gen)
    mask = (torch.rand(3, 6, generator=gen) < 0.7).long()
    boot = torch.randn(3, generator=gen)

    def run(r=rewards, v=values, m=mask, b=boot, lam=0.9):
        return compute_token_gae(r, v, m, bootstrap_values=b, discount=0.99, gae_lambda=lam)

    for m in (mask, mask.bool(), mask.int(), mask.float(), mask.double(), mask.to(torch.uint8)):
        calls.clear()
        got = run(m=m)
        assert calls == [1]
        with native.disabled():
            want = run(m=m)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    for kwargs in ({"m": mask.to(torch.int16)}, {"lam": torch.full((3,), 0.9, dtype=torch.float64)},
                   {"r": rewards.half(), "v": values.half(), "b": boot.half()}):
        calls.clear()
        run(**kwargs)
        assert calls == ([1] if "r" in kwargs else []), kwargs


@pytest.mark.parametrize("bad", [2.0, -1.0, 0.5, float("nan")])
def test_the_kernel_loop_refuses_masks_other_than_0_and_1(bad):
    mask = torch.ones(2, 5)
    mask[1, 3] = bad
    with pytest.raises(ValueError, match=r"compute_token_gae: loss_mask must hold only 0 and 1"):
        compute_token_gae(torch.zeros(2, 5), torch.zeros(2, 5), mask,
                          bootstrap_values=torch.zeros(2), discount=1.0, gae_lambda=1.0)


def test_which_tensors_the_turn_loop_takes(monkeypatch):
    """int32/int64 turn ids on the CPU; other id dtypes go through torch (float ids are
    refused there), with the same numbers and errors."""
    calls = []
    loop = native.turn_gae
    monkeypatch.setattr(native, "turn_gae", lambda *a: calls.append(1) or loop(*a))
    mask = torch.tensor([[0, 1, 1, 0, 1, 1, 0], [0, 0, 1, 1, 1, 0, 0]])
    ids = torch.tensor([[-1, 0, 0, -1, 2, 3, -1], [-1, -1, 5, 5, 5, -1, -1]])
    gen = torch.Generator().manual_seed(1)
    rewards, values = torch.randn(2, 7, generator=gen), torch.randn(2, 7, generator=gen)

    def run(i):
        return compute_turn_gae(rewards, values, mask, i, bootstrap_values=torch.zeros(2),
                                discount=0.9, gae_lambda=0.8)

    for i, taken in ((ids, True), (ids.int(), True), (ids.to(torch.int16), False)):
        calls.clear()
        got = run(i)
        assert calls == ([1] if taken else [])
        with native.disabled():
            want = run(i)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    decreasing = ids.clone()
    decreasing[0, 5] = 1
    for path in (native.disabled, lambda: __import__("contextlib").nullcontext()):
        with path(), pytest.raises(ValueError, match=r"compute_turn_gae: turn_ids at active "
                                                      r"loss tokens must be non-decreasing "
                                                      r"along each row \(rows \[0\]\)"):
            run(decreasing)


def test_normalization_with_a_mask_of_another_shape_takes_the_torch_steps():
    # The loops read B·T mask entries; a broadcastable [1, T] mask goes to the torch steps,
    # and the loops' own entry points refuse it instead of reading past it.
    from lightning_adv.config import NormConfig
    from lightning_adv.normalization import normalize
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(16) < 11).float()[None, :]
    config = NormConfig(mean_level="batch", std_level="batch")
    got = normalize(x, config, mask)
    with native.disabled():
        want = normalize(x, config, mask)
    torch.testing.assert_close(got, want)
    assert got[:, 11:].abs().sum() == 0 and got[:, :11].abs().sum() > 0
    with pytest.raises(ValueError, match=r"mask of shape \(1, 16\) for advantages of shape"):
        native.masked_moments(x, mask)
    with pytest.raises(ValueError, match="expected both"):
        native.masked_affine(x, mask, torch.zeros(8), torch.ones(8))
