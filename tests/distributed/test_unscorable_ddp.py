"""DDP (real gloo processes on CPU) with unscorable rows (``actor.unscorable_rewards:
exclude``): a rank whose rows are all unscorable still takes part in every collective of
the batch-level statistics, so its peer neither hangs nor fails, the peer's numbers are
those of a single process holding the scored rows only, and the rank itself gets all-zero
advantages. A step where no rank has a scored row fails on every rank together.

The workers run with a 60 s gloo timeout and are joined with a deadline, so a hang fails
the test instead of blocking the run.
"""

import math
import warnings

import pytest
import torch
import torch.multiprocessing as mp

import tests.support.unscorable_ddp_workers as workers
from lightning_adv import ActorConfig, AdvantageModule, concat_batch

DEADLINE_S = 240


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("unscorable_ddp")
    context = mp.get_context("spawn")
    procs = [context.Process(target=workers.worker, args=(rank, 2, str(tmp / "init"), str(tmp)))
             for rank in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(DEADLINE_S)
    hung = [rank for rank, proc in enumerate(procs) if proc.is_alive()]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert not hung, f"ranks {hung} still running after {DEADLINE_S} s: a collective hung"
    assert [proc.exitcode for proc in procs] == [0, 0]
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(2)]


def single_process(config, groups):
    batch, meta = concat_batch(groups)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AdvantageModule(ActorConfig(**config, unscorable_rewards="exclude"))(batch, meta)


def assert_matches(local, want, what):
    for key in ("advantages", "returns", "tot_rewards", "kl_rewards", "loss_mask"):
        got, expected = local[key].double(), want[key].double()
        width = got.shape[1]  # each rank pads to its own widest prompt
        assert expected[:, width:].abs().sum() == 0, (what, key)
        assert torch.allclose(got, expected[:, :width], atol=1e-6, rtol=1e-6), (what, key)


@pytest.mark.parametrize("name", sorted(workers.CONFIGS))
def test_a_rank_without_scored_rows_joins_the_collectives_and_gets_zeros(ddp_results, name):
    rank0, rank1 = (ddp_results[r]["rank1_all_unscorable", name] for r in range(2))
    assert "error" not in rank0 and "error" not in rank1, (rank0.get("error"), rank1.get("error"))
    # Rank 0's statistics are those of its own rows: rank 1 contributed nothing.
    groups = workers.scenario_groups("rank1_all_unscorable")
    assert_matches(rank0, single_process(workers.CONFIGS[name], groups[:2]), (name, 0))
    assert rank0["unscorable"].tolist() == [False] * rank0["unscorable"].numel()
    assert rank1["unscorable"].all()
    mask = rank1["loss_mask"]
    assert float(rank1["advantages"].abs().sum()) == 0.0
    assert float(rank1["tot_rewards"].abs().sum()) == 0.0
    assert float(rank1["kl_rewards"].abs().sum()) == 0.0
    assert mask.sum() > 0  # real loss mask: the rows count in token means
    # Returns: each row's own (aligned) values, so the critic gets no signal.
    single = single_process(workers.CONFIGS[name], groups)  # the global batch, one process
    width = mask.shape[1]
    assert torch.allclose(rank1["returns"], single["returns"][-mask.shape[0]:, :width], atol=1e-6)


@pytest.mark.parametrize("name", sorted(workers.CONFIGS))
def test_partly_unscorable_ranks_match_one_process_on_the_global_batch(ddp_results, name):
    single = single_process(workers.CONFIGS[name], workers.scenario_groups("partly_unscorable"))
    rows0 = ddp_results[0]["partly_unscorable", name]["advantages"].shape[0]
    for rank, rows in ((0, slice(0, rows0)), (1, slice(rows0, None))):
        local = ddp_results[rank]["partly_unscorable", name]
        assert "error" not in local, local.get("error")
        assert_matches(local, {k: v[rows] for k, v in single.items()
                               if isinstance(v, torch.Tensor)}, (name, rank))
        assert torch.equal(local["unscorable"], single["unscorable"][rows])


@pytest.mark.parametrize("name", sorted(workers.CONFIGS))
def test_no_scored_row_on_any_rank_fails_every_rank_together(ddp_results, name):
    for rank in range(2):
        error = ddp_results[rank]["no_row_scored", name]["error"]
        assert error == ("ValueError: rollout batch 'rewards': every row is NaN (unscorable), "
                         "nothing to compute advantages from on every one of the 2 ranks"), error


def test_the_scenarios_hold_what_they_say():
    groups = workers.scenario_groups("partly_unscorable")
    nan = [int(g["rewards"].isnan().sum()) for g in groups]
    assert nan == [0, 1, 2, 0]  # both ranks keep scored rows; prompt 1's split rollout is whole
    assert not math.isnan(groups[1]["rewards"][:2].sum())
    assert int(workers.scenario_groups("rank1_all_unscorable")[2]["rewards"].isnan().sum()) == 4
