"""``shard_policies`` on two gloo processes, pass by pass against an unsharded copy of the
same weights: a policy with a value head, one with a separate critic model, one with LoRA
adapters. Every weight of the policy, its critic and value head, and of the frozen
reference is a shard; forward passes, the reference's, the averaged gradients, decoding
(a different number of passes on each rank) and the gathered state dict equal those of
the unsharded copy."""

import pytest
import torch
import torch.multiprocessing as mp

from tests.support.fsdp_workers import CASES, worker


@pytest.fixture(scope="module")
def ranks(tiny_lm, tmp_path_factory):
    out = tmp_path_factory.mktemp("sharding")
    mp.start_processes(worker, args=(2, str(out / "init"), tiny_lm, str(out)), nprocs=2,
                       join=True, start_method="spawn")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.parametrize("case", list(CASES))
def test_every_weight_is_a_shard_and_every_pass_matches_the_unsharded_model(ranks, case):
    for rank, results in enumerate(ranks):
        got = results[case]
        held = {**got["policy"], **got.get("reference", {})}
        plain = [name for name, how in held.items() if how != ("Shard(0)",)]
        assert not plain, (rank, plain)
        assert any(name.startswith("value_head.") for name in got["policy"])
        if case == "critic":
            assert any(name.startswith("critic.layers.") for name in got["policy"])
        if case == "lora":  # the reference is the policy itself, adapters off: no copy
            assert "reference" not in got and any("lora_A" in n for n in got["policy"])
        else:
            assert any(name.startswith("model.model.layers.") for name in got["reference"])
        assert got["forward"] < 1e-5 and got["reference_pass"] < 1e-5, rank
        assert got["reference_moves"] > 1e-3  # the policy has left the reference behind
        assert got["grad_names"] and got["grads"] < 1e-6 * max(1.0, got["grad_scale"]), rank
        assert got["decode"] < 1e-5 and got["decode_steps"] == rank + 2
        assert got["state_keys"]
    assert ranks[0][case]["state"] == 0.0 and ranks[0][case]["state_plain"]


@pytest.mark.parametrize("strategy, policy, message", [
    ("fsdp", "any", r"trainer.strategy: FSDP1 \(fsdp\) wraps the whole module.*fsdp2"),
    ("fsdp2", "built-in", "trainer.strategy: FSDP2 shards Hugging Face policies.*strategy=ddp"),
    ("fsdp2", "base", "trainer.strategy: FSDP2 shards Hugging Face policies.*strategy=ddp"),
])
def test_strategies_the_trainer_cannot_shard_with_are_refused_naming_the_key(strategy, policy,
                                                                             message):
    from lightning.pytorch.strategies import FSDPStrategy

    from lightning_adv.trainer.policies.base import Policy
    from lightning_adv.trainer.policies.config import PolicyConfig
    from lightning_adv.trainer.policies.sharding import FSDP2Strategy, configure_sharding
    from lightning_adv.trainer.policies.tiny import TinyPolicy

    chosen = FSDPStrategy() if strategy == "fsdp" else FSDP2Strategy()
    if strategy == "fsdp2":  # the mesh of one data-parallel rank (a run has set it up)
        one_rank = type("Mesh", (), {"size": lambda self: 1})()
        chosen._device_mesh = {"tensor_parallel": one_rank, "data_parallel": one_rank}
    built = {"any": lambda: torch.nn.Linear(2, 2), "base": Policy,
             "built-in": lambda: TinyPolicy(PolicyConfig(d_model=8, n_heads=2), 5, 8)}[policy]()
    with pytest.raises(ValueError, match=message):
        configure_sharding(chosen, built, None)


def test_fsdp2_is_a_strategy_name_lightning_knows():
    import lightning.pytorch as pl

    from lightning_adv.trainer.policies.sharding import FSDP2Strategy

    trainer = pl.Trainer(strategy="fsdp2", accelerator="cpu", devices=2, logger=False,
                         enable_checkpointing=False)
    assert isinstance(trainer.strategy, FSDP2Strategy)
