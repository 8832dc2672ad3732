"""Reused scratch memory never shows: a buffer still referenced is never handed out twice,
outputs of two calls never share storage, and results are those of fresh memory.

Workspaces serve the torch kernels (on CPU the module's fused native pass needs none):
tests of the module's memory reuse run with the torch kernels."""

from __future__ import annotations

import copy
import pickle
import threading

import pytest
import torch

from lightning_adv import ActorConfig, AdvantageModule, NormConfig, compute_token_gae, compute_turn_gae
from lightning_adv.testing.synthetic import realistic_inputs
from lightning_adv.workspace import MIN_BYTES, Workspace, scratch

BIG = (64, 1024)  # above MIN_BYTES in float32: pool memory
assert BIG[0] * BIG[1] * 4 >= MIN_BYTES


def storage_span(t: torch.Tensor) -> tuple[int, int]:
    start = t.untyped_storage().data_ptr()
    return start, start + t.untyped_storage().nbytes()


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    (a0, a1), (b0, b1) = storage_span(a), storage_span(b)
    return a0 < b1 and b0 < a1


def test_a_referenced_buffer_is_never_handed_out_again():
    workspace = Workspace()
    with workspace.active():
        first = scratch(BIG, torch.float32, torch.device("cpu"))
        view = first[:, 1:]
        del first
        second = scratch(BIG, torch.float32, torch.device("cpu"))
        assert not overlaps(view, second)  # the view keeps the first buffer in use
        del view
        third = scratch(BIG, torch.float32, torch.device("cpu"))
        assert not overlaps(second, third)
        del second
        # now free: the pool reuses the memory of the first buffer (or the second's)
        fourth = scratch(BIG, torch.float32, torch.device("cpu"))
        assert fourth.is_contiguous() and tuple(fourth.shape) == BIG
    assert len(workspace._pool) == 2


def test_buffers_grow_and_narrower_batches_reuse_them():
    workspace = Workspace()
    with workspace.active():
        big = scratch((128, 1024), torch.float64, torch.device("cpu"))
        ptr = big.data_ptr()
        del big
        small = scratch((64, 1000), torch.float64, torch.device("cpu"))
        assert small.data_ptr() == ptr and small.is_contiguous()
        del small
        bigger = scratch((256, 1024), torch.float64, torch.device("cpu"))
        assert bigger.numel() == 256 * 1024
        del bigger
        # any dtype reuses the bytes
        longs = scratch((256, 1024), torch.long, torch.device("cpu"))
        assert longs.dtype == torch.long and longs.is_contiguous()
    assert workspace.nbytes == 256 * 1024 * 8  # the too-small buffer was replaced, not kept


def test_without_an_active_workspace_scratch_is_fresh_memory():
    a = scratch(BIG, torch.float32, torch.device("cpu"))
    b = scratch(BIG, torch.float32, torch.device("cpu"))
    assert not overlaps(a, b)


def output_tensors(out: dict, batch: dict) -> list[torch.Tensor]:
    """The tensors the module made (not inputs passed through)."""
    inputs = {id(v) for v in batch.values()}
    return [v for v in out.values() if isinstance(v, torch.Tensor) and id(v) not in inputs]


CONFIGS = [ActorConfig(), ActorConfig(kl_ctl=0.01, gae_lambda=0.95, adv_norm=NormConfig()),
           ActorConfig(kl_ctl=0.0, reward_norm=NormConfig(mean_level="group", std_level="group")),
           ActorConfig(gae_timestep_unit="turn", gae_lambda=0.9)]


@pytest.mark.parametrize("path", ["native", "torch"])
@pytest.mark.parametrize("config", CONFIGS)
def test_outputs_of_two_calls_never_share_storage_or_change(config, path, request):
    if path == "torch":
        request.getfixturevalue("torch_kernels")
    module = AdvantageModule(config)
    x = realistic_inputs(*BIG, torch.device("cpu"))
    y = realistic_inputs(*BIG, torch.device("cpu"), seed=1)
    first = module(x.batch, x.meta)
    kept = {k: v.clone() for k, v in first.items() if isinstance(v, torch.Tensor)}
    second = module(y.batch, y.meta)
    third = module(x.batch, x.meta)
    made_1, made_2 = output_tensors(first, x.batch), output_tensors(second, y.batch)
    assert made_1 and len(made_1) == len(made_2)
    for a in made_1:
        for b in made_2 + output_tensors(third, x.batch):
            assert not overlaps(a, b)
    for key, value in kept.items():  # later calls did not write into the first call's outputs
        assert torch.equal(first[key], value), key
    for key in kept:  # the same batch gives the same numbers, with the memory reused
        assert torch.equal(first[key], third[key]), key
    if path == "torch":
        assert module.workspaces.nbytes > 0  # the module did reuse memory


def test_workspace_results_equal_fresh_memory_results():
    x = realistic_inputs(*BIG, torch.device("cpu"))
    args = (x.rewards, x.values, x.loss_mask)
    for lam in (1.0, 0.95, 0.0, 1e-6, x.row_lambda):
        fresh = compute_token_gae(*args, bootstrap_values=x.bootstrap, discount=0.99, gae_lambda=lam)
        with Workspace().active():
            reused = compute_token_gae(*args, bootstrap_values=x.bootstrap, discount=0.99,
                                       gae_lambda=lam)
        for a, b in zip(fresh, reused):
            assert torch.equal(a, b)
    fresh = compute_turn_gae(*args, x.turn_ids, bootstrap_values=x.bootstrap, discount=1.0,
                             gae_lambda=0.95)
    workspace = Workspace()
    with workspace.active():
        reused = compute_turn_gae(*args, x.turn_ids, bootstrap_values=x.bootstrap, discount=1.0,
                                  gae_lambda=0.95)
    for a, b in zip(fresh, reused):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_blocks_in_a_workspace_equal_the_whole_batch(monkeypatch, dtype):
    """Each block of rows of the CPU token kernel reuses the previous block's temporaries
    (and a float64 result of one block may itself be scratch memory): every block, and a
    second call reusing the pool, gives the numbers of the whole batch in fresh memory."""
    from lightning_adv import kernels

    x = realistic_inputs(*BIG, torch.device("cpu"))
    args = (x.rewards.to(dtype), x.values.to(dtype), x.loss_mask)
    for lam in (1.0, 0.95, 0.0, 1e-6, x.row_lambda):
        whole = compute_token_gae(*args, bootstrap_values=x.bootstrap.to(dtype), discount=0.99,
                                  gae_lambda=lam)
        # 9 rows of 1024 per block: seven blocks and a ragged one of 1 row
        monkeypatch.setattr(kernels, "CPU_BLOCK_ELEMENTS", 9 * BIG[1])
        assert kernels._rows_per_block(args[0]) == 9
        with Workspace().active():
            for _ in range(2):
                blocked = compute_token_gae(*args, bootstrap_values=x.bootstrap.to(dtype),
                                            discount=0.99, gae_lambda=lam)
                for a, b in zip(whole, blocked):
                    assert torch.equal(a, b), lam
        monkeypatch.undo()


def test_float64_kernel_outputs_are_not_scratch_memory():
    # float64 inputs make float64 outputs: the kernel must not return its float64 scratch
    x = realistic_inputs(*BIG, torch.device("cpu"))
    args = [t.double() for t in (x.rewards, x.values, x.loss_mask)]
    workspace = Workspace()
    with workspace.active():
        for lam in (1.0, 0.95):
            adv, ret = compute_token_gae(*args, bootstrap_values=x.bootstrap.double(), discount=1.0,
                                         gae_lambda=lam)
            for buffer in workspace._pool:
                assert not overlaps(adv, buffer.flat) and not overlaps(ret, buffer.flat)


def test_two_threads_calling_one_module_get_their_own_memory():
    module = AdvantageModule(ActorConfig(kl_ctl=0.01, gae_lambda=0.95, adv_norm=NormConfig()))
    inputs = [realistic_inputs(*BIG, torch.device("cpu"), seed=s) for s in range(4)]
    want = [module(x.batch, x.meta)["advantages"] for x in inputs]
    got: dict[int, list] = {}

    def work(i: int) -> None:
        got[i] = [module(inputs[i].batch, inputs[i].meta)["advantages"] for _ in range(5)]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        for adv in got[i]:
            assert torch.equal(adv, want[i])


def test_copies_and_pickles_of_a_module_carry_no_scratch_memory(torch_kernels):
    module = AdvantageModule(ActorConfig())
    x = realistic_inputs(*BIG, torch.device("cpu"))
    module(x.batch, x.meta)
    assert module.workspaces.nbytes > 0
    assert copy.deepcopy(module).workspaces.nbytes == 0
    restored = pickle.loads(pickle.dumps(module))
    assert restored.workspaces.nbytes == 0
    assert torch.equal(restored(x.batch, x.meta)["advantages"], module(x.batch, x.meta)["advantages"])
    module.workspaces.release()
    assert module.workspaces.nbytes == 0
