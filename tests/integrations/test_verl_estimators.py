"""Every estimator verl 0.9.1 and this project both have, called through verl's own
registry after register(): the la_ adapter gives verl's numbers (its released code,
pinned by hash), or the difference docs/guides/verl.md documents, whose size is measured
here (a difference that grew or vanished fails the test, so the page stays true)."""

import warnings

import numpy as np
import pytest
import torch

from lightning_adv.integrations.verl import VERL_ESTIMATORS, register
from tests.support.peers import VERL_CORE_ALGOS, peer_module

pytestmark = pytest.mark.peers


@pytest.fixture(scope="module")
def core():
    module = peer_module(*VERL_CORE_ALGOS)
    register()
    return module


@pytest.fixture(scope="module")
def algo_config():
    from verl.trainer.config import AlgoConfig  # the pinned release (checked by `core`)

    return AlgoConfig


def responses(seed: int, *, dense: bool, rows: int = 14, width: int = 9, tools: bool = True):
    """verl's inputs: right-padded responses, a masked tool span in two rows (``tools``), an outcome
    reward at each row's last generated token (plus, ``dense``, a per-token reward on
    every generated token: an in-reward KL penalty), groups in shuffled order."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, width + 1, (rows,), generator=g)
    mask = (torch.arange(width)[None] < lengths[:, None]).float()
    if tools:
        mask[0, 1:3] = 0
        mask[3, 1] = 0
    last = (mask * torch.arange(width)).argmax(1)
    rewards = torch.zeros(rows, width)
    rewards[torch.arange(rows), last] = torch.randint(0, 3, (rows,), generator=g).float() * 0.5
    if dense:
        rewards += torch.randn(rows, width, generator=g) * 0.1 * mask
    index = np.array(["p0", "p1", "p2", "p3"])[torch.randint(0, 4, (rows,), generator=g).numpy()]
    logp = -torch.rand(rows, width, generator=g) * 2 * mask
    pi = logp.exp()
    return {"token_level_rewards": rewards, "response_mask": mask, "index": index,
            "values": torch.randn(rows, width, generator=g) * mask,
            "old_log_probs": logp,
            "sum_pi_squared": pi ** 2 + (1 - pi) ** 2 * torch.rand(rows, width, generator=g),
            "reward_baselines": torch.rand(rows, generator=g),
            "rollout_is_weights": torch.rand(rows, width, generator=g) * 1.5 + 0.2}


def verl_kwargs(name: str, data: dict, config) -> dict:
    """The keyword arguments verl 0.9.1's compute_advantage gives the estimator ``name``
    (its built-in gae: values, gamma, lam; the rest: index, config, and
    reward_baselines / the optimal token baseline's inputs where its batch has them)."""
    kw = {"token_level_rewards": data["token_level_rewards"].clone(),
          "response_mask": data["response_mask"].clone()}
    if name == "gae":
        return {**kw, "values": data["values"].clone(), "gamma": config.gamma, "lam": config.lam}
    kw.update(index=data["index"], config=config)
    if name == "remax":
        kw["reward_baselines"] = data["reward_baselines"].clone()
    if name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        kw.update(old_log_probs=data["old_log_probs"].clone(),
                  sum_pi_squared=data["sum_pi_squared"].clone(),
                  rollout_is_weights=data["rollout_is_weights"].clone())
    return kw


def both(core, name, kw, **theirs_extra):
    theirs = core.get_adv_estimator_fn(name)(**{**kw, **theirs_extra})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = core.get_adv_estimator_fn("la_" + VERL_ESTIMATORS[name])(
            **{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()})
    return ours, theirs


def gap(ours, theirs, mask):
    active = mask > 0
    return (ours[0] - theirs[0])[active].abs().max().item()


#: Estimators whose advantages equal verl's to float rounding (float32, 1e-6), on batches
#: with tool spans (response_mask 0 inside a response) except verl's column-counting
#: optimal_token_baseline (below: the difference there).
EQUAL = ("grpo", "rloo", "remax", "opo", "grpo_passk", "optimal_token_baseline",
         "tir_optimal_token_baseline")
WITH_TOOL_SPANS = ("grpo", "rloo", "remax", "opo", "grpo_passk", "tir_optimal_token_baseline")
#: Estimators that whiten over the batch: verl's masked_whiten divides by sqrt(var + 1e-8),
#: this project's normalization by std + 1e-5 (NormConfig.eps): a relative difference of
#: about 1e-5 / std.
WHITENED = ("gae", "reinforce_plus_plus", "reinforce_plus_plus_baseline")


#: (name, handle_zero_tail passed to both: None is verl's default, True, kept by the adapter)
EQUAL_CASES = [(name, tail) for name in EQUAL
               for tail in ((None, False) if "optimal_token" in name else (None,))]


@pytest.mark.parametrize("dense", [False, True], ids=["outcome", "per-token"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name, zero_tail", EQUAL_CASES,
                         ids=[f"{n}-tail{t}" for n, t in EQUAL_CASES])
def test_estimators_equal_verls(core, algo_config, name, zero_tail, seed, dense):
    data = responses(seed, dense=dense, tools=name in WITH_TOOL_SPANS)
    config = algo_config(gamma=0.95, lam=0.9)
    kw = verl_kwargs(name, data, config)
    if zero_tail is not None:
        kw["handle_zero_tail"] = zero_tail
    ours, theirs = both(core, name, kw)
    mask = data["response_mask"] > 0
    torch.testing.assert_close(ours[0][mask], theirs[0][mask].float(), rtol=1e-5, atol=1e-6)
    assert ours[0].shape == theirs[0].shape


@pytest.mark.parametrize("dense", [False, True], ids=["outcome", "per-token"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", WHITENED)
def test_whitened_estimators_differ_by_the_whitening_epsilon(core, algo_config, name, seed, dense):
    data = responses(seed, dense=dense)
    config = algo_config(gamma=0.95, lam=0.9)
    ours, theirs = both(core, name, verl_kwargs(name, data, config))
    mask = data["response_mask"] > 0
    if name != "reinforce_plus_plus_baseline":  # verl returns its whitened advantages there
        # returns (the critic's targets) are not whitened: equal
        torch.testing.assert_close(ours[1][mask], theirs[1][mask].float(), rtol=1e-5, atol=1e-6)
    assert 1e-7 < gap(ours, theirs, mask) < 1e-4


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gpg_differs_in_its_rescaling_factor(core, algo_config, seed):
    """verl 0.9.1's gpg rescales by B / (number of non-zero rewards); this project's by
    B / (B - M), M the responses of groups whose rewards are all equal (the GPG paper,
    arXiv:2504.02546). Same group baseline: the ratio of the two is one number per batch."""
    data = responses(seed, dense=False)
    ours, theirs = both(core, "gpg", verl_kwargs("gpg", data, algo_config()))
    mask = data["response_mask"] > 0
    scores = data["token_level_rewards"].sum(1)
    b = len(scores)
    verl_alpha = b / max(int((scores != 0).sum()), 1)
    groups = {}
    for g, s in zip(data["index"], scores.tolist()):
        groups.setdefault(g, []).append(s)
    m = sum(len(v) for v in groups.values() if len(set(v)) == 1)
    our_alpha = b / (b - m) if b > m else 1.0
    torch.testing.assert_close(ours[0][mask] * verl_alpha, theirs[0][mask] * our_alpha,
                               rtol=1e-5, atol=1e-6)
    if verl_alpha != our_alpha:
        assert gap(ours, theirs, mask) > 1e-3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gdpo_differs_in_its_batch_whitening(core, algo_config, seed):
    """verl 0.9.1's gdpo whitens the weighted sum over tokens (masked_whiten: each row
    weighted by its length, eps inside the sqrt); this project's recipe whitens one value
    per row (TRL's normalize_then_sum, eps 1e-4). Both are zero-mean, unit-variance
    rescalings of the same per-row sums: equal up to an affine map per batch."""
    data = responses(seed, dense=False)
    ours, theirs = both(core, "gdpo", verl_kwargs("gdpo", data, algo_config()))
    mask = data["response_mask"] > 0
    ours_row, theirs_row = ours[0][:, 0].double(), theirs[0][:, 0].double()
    slope = torch.linalg.lstsq(torch.stack([ours_row, torch.ones_like(ours_row)], 1),
                               theirs_row[:, None]).solution.flatten()
    torch.testing.assert_close(ours_row * slope[0] + slope[1], theirs_row, rtol=1e-4, atol=1e-4)
    assert 0.01 < gap(ours, theirs, mask) < 1.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_optimal_token_baseline_numbers_steps_by_generated_token_verl_by_column(
        core, algo_config, seed):
    """A tool span (response_mask 0) inside a response: this project numbers the optimal
    token baseline's steps by generated token (the masked-token rule: a span never moves
    another token's advantage; verl's tir_optimal_token_baseline, equal above), verl
    0.9.1's optimal_token_baseline by column, so the rows of a group with a tool span
    differ; groups without one are equal."""
    data = responses(seed, dense=True)
    kw = verl_kwargs("optimal_token_baseline", data, algo_config())
    ours, theirs = both(core, "optimal_token_baseline", kw)
    mask = data["response_mask"] > 0
    spans = {data["index"][0], data["index"][3]}  # the groups of the rows with a tool span
    plain = torch.tensor([g not in spans for g in data["index"]])
    torch.testing.assert_close(ours[0][plain][mask[plain]], theirs[0][plain][mask[plain]],
                               rtol=1e-5, atol=1e-6)
    assert 0.01 < gap(ours, theirs, mask) < 2.0


def test_grpo_singleton_group_differs(core, algo_config):
    """A prompt with one response: verl's grpo uses mean 0 and std 1 (advantage
    r / (1 + eps)); this project gives it advantage 0 (no peer to compare with)."""
    data = responses(0, dense=False)
    data["index"] = data["index"].copy()
    data["index"][5] = "alone"
    ours, theirs = both(core, "grpo", verl_kwargs("grpo", data, algo_config()))
    mask = data["response_mask"] > 0
    reward = float(data["token_level_rewards"][5].sum())
    assert torch.all(ours[0][5][mask[5]] == 0)
    torch.testing.assert_close(theirs[0][5][mask[5]], torch.full_like(theirs[0][5][mask[5]],
                                                                        reward / (1 + 1e-6)))
    others = torch.ones_like(mask)
    others[5] = False
    torch.testing.assert_close(ours[0][mask & others], theirs[0][mask & others], rtol=1e-5, atol=1e-6)


def test_gdpo_reads_verls_reward_columns(core, algo_config):
    """algorithm.gdpo_reward_keys: verl's gdpo normalizes each named column of its
    non_tensor_batch within the group, weights and sums; la_gdpo reads the same columns
    and weights. Same affine relation as above (the final whitening differs)."""
    data = responses(1, dense=False)
    rows, width = data["response_mask"].shape
    g = torch.Generator().manual_seed(7)
    columns = {"format": (torch.rand(rows, generator=g) > 0.5).float().numpy(),
               "accuracy": torch.randint(0, 3, (rows,), generator=g).float().numpy()}
    # verl puts each column at the attended response length - 1: rows without a tool span
    mask = data["response_mask"]
    for row in (0, 3):
        mask[row, :int((mask[row] * torch.arange(1, width + 1)).max())] = 1.0
    batch = {"prompts": torch.zeros(rows, 2, dtype=torch.long),
             "attention_mask": torch.cat([torch.ones(rows, 2), mask], 1).long()}
    config = algo_config(gdpo_reward_keys=["format", "accuracy"], gdpo_reward_weights=[1.0, 0.5])
    kw = {"token_level_rewards": data["token_level_rewards"], "response_mask": data["response_mask"],
          "index": data["index"], "config": config, "non_tensor_batch": columns, "batch": batch}
    ours, theirs = both(core, "gdpo", kw)
    ours_row, theirs_row = ours[0][:, 0].double(), theirs[0][:, 0].double()
    slope = torch.linalg.lstsq(torch.stack([ours_row, torch.ones_like(ours_row)], 1),
                               theirs_row[:, None]).solution.flatten()
    torch.testing.assert_close(ours_row * slope[0] + slope[1], theirs_row, rtol=1e-4, atol=1e-4)
    assert float(slope[0]) > 0.5
    plain, _ = both(core, "gdpo", {k: v for k, v in kw.items()  # without the columns: the sum
                                   if k not in ("non_tensor_batch", "batch")})
    assert not torch.allclose(plain[0], ours[0])
