"""DDP with real processes (gloo on CPU): batch statistics reduce across ranks, so each
rank's advantages equal a single process holding the global batch; group statistics stay
on their rank."""

from datetime import timedelta

import torch
import lightning as L
from lightning.pytorch.strategies import DDPStrategy
import pytest

from tests.support.ddp_probe import AdvantageProbe, advantages, prompt_groups
from lightning_adv import ActorConfig
from lightning_adv.recipes import RECIPES

CONFIGS = {
    "batch_norms": {"reward_norm": {"mean_level": "batch", "std_level": "batch"},
                    "adv_norm": {"mean_level": "batch", "mean_leave1out": True, "std_level": "batch"},
                    "discount": 0.9, "gae_lambda": 0.95},
    "group_reward_batch_adv": {"reward_norm": {"mean_level": "group", "std_level": "group"},
                               "adv_norm": {"mean_level": "batch", "std_level": "batch",
                                            "std_unbiased": False}},
    "group_only": {"reward_norm": {"mean_level": "group", "mean_leave1out": True,
                                   "std_level": None},
                   "adv_norm": {"mean_level": "group", "std_level": "group"}},
    "gpg": RECIPES["gpg"],
    "reinforce_pp": RECIPES["reinforce_pp"],
    # TRL's batch scaling: the std of the whole batch's rewards, summed over ranks.
    "grpo_batch_std": RECIPES["grpo_batch_std"],
    "rloo_kl": RECIPES["rloo_kl"],
    "split_rows_disagree": {"reward_norm": {"mean_level": "batch", "std_level": "batch"}},
    # Rank 0 holds only one-row rollouts (nothing of its own to compare), rank 1 split
    # ones: both must still join the agreement check.
    "one_row_rollouts_on_rank0": {"reward_norm": {"mean_level": "group", "std_level": "group"},
                                  "adv_norm": {"mean_level": "batch", "std_level": "batch"}},
    "split_rows_disagree_beside_one_row_rank": {"reward_norm": {"mean_level": "batch",
                                                                "std_level": "batch"}},
    # Errors raised on one rank only, before and after the collectives.
    "dropped_reward_on_rank0": {"dropped_outcome_reward": "raise",
                                "adv_norm": {"mean_level": "batch", "std_level": "batch"}},
    "process_range_on_rank1": {"adv_norm": {"mean_level": "batch", "std_level": "batch"},
                               "advantage": {"process_adv_shaping": "process_weighted"}},
}
SPOILED = {"split_rows_disagree": [(3, "split_rows")],
           "dropped_reward_on_rank0": [(0, "tool_tail")],
           "process_range_on_rank1": [(2, "process_range")],
           "one_row_rollouts_on_rank0": [(1, "one_row")],
           "split_rows_disagree_beside_one_row_rank": [(1, "one_row"), (3, "split_rows")]}
FAILING = {"split_rows_disagree", "dropped_reward_on_rank0", "process_range_on_rank1",
           "split_rows_disagree_beside_one_row_rank"}


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    # A short collective timeout: ranks that disagree on which collectives they call
    # fail this fixture in two minutes instead of hanging for Lightning's thirty.
    strategy = DDPStrategy(start_method="spawn", timeout=timedelta(seconds=120))
    trainer = L.Trainer(strategy=strategy, accelerator="cpu", devices=2, max_epochs=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(AdvantageProbe(CONFIGS, str(out), broken=SPOILED))
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(2)]


@pytest.mark.parametrize("name", [n for n in CONFIGS if n not in FAILING])
def test_two_ranks_match_a_single_process(ddp_results, name):
    single = advantages(ActorConfig(**CONFIGS[name]), prompt_groups(broken=SPOILED.get(name, ())))
    rows0 = ddp_results[0][name]["rewards"].shape[0]
    for rank, rows in ((0, slice(0, rows0)), (1, slice(rows0, None))):
        for key, want in single.items():
            local = ddp_results[rank][name][key].double()
            want = want[rows].double()
            if want.ndim == 2:  # each rank pads to its own widest prompt
                width = local.shape[1]
                assert want[:, width:].abs().sum() == 0, (name, key, rank)
                want = want[:, :width]
            assert torch.allclose(local, want, atol=1e-6, rtol=1e-6), (name, key, rank)


def test_a_bad_batch_on_one_rank_raises_on_every_rank(ddp_results):
    # Only rank 1's prompts hold a split rollout; with batch-level statistics both ranks
    # must raise together (a lone raise would leave the other rank hanging in a collective).
    for rank in range(2):
        assert "split rollout" in ddp_results[rank]["split_rows_disagree"]["error"], rank


def test_a_rank_with_only_one_row_rollouts_still_joins_the_agreement(ddp_results):
    # Rank 0 has nothing to compare (every rollout one row); it must still take part in
    # the check, and raise with rank 1 when rank 1's split rollout disagrees.
    name = "split_rows_disagree_beside_one_row_rank"
    assert "rows on another data-parallel rank" in ddp_results[0][name]["error"]
    assert "rows [" in ddp_results[1][name]["error"]


@pytest.mark.parametrize("name, failing_rank, message", [
    ("dropped_reward_on_rank0", 0, "inactive position"),
    ("process_range_on_rank1", 1, "process_weighted"),
])
def test_an_error_on_one_rank_fails_its_peers_instead_of_hanging(ddp_results, name, failing_rank,
                                                                 message):
    # The failing rank raises its own error; the other one, waiting in a collective (or at
    # the end of its forward), raises PeerRankFailed instead of hanging.
    assert message in ddp_results[failing_rank][name]["error"]
    assert ddp_results[1 - failing_rank][name]["error"].startswith("PeerRankFailed: another")
