"""The built-in trainer samples tree rollouts (``ppo.tree``): every shared prefix sampled
once, the rows' ``tree_node_ids`` a valid tree (ops/trees.py's checks), the log-probs
of every token as sampled, the cost counted once per token, config errors."""

import pytest
import torch

from lightning_adv.ops.trees import tree_paths
from lightning_adv.trainer.config import TreeConfig
from lightning_adv.trainer.data import generator
from lightning_adv.trainer.policies.base import GenerationRequest, SamplingParams, ScoreRequest
from lightning_adv.trainer.ppo import PPOModule
from lightning_adv.trainer.rollout.tree import sample_tree

TREE_ACTOR = {"kl_ctl": 0.0, "advantage": {"estimator": {"implementation": "treerl"}}}
REVERSE = {"name": "reverse", "kwargs": {"alphabet": "abcde", "min_len": 5, "max_len": 8}}
POLICY = {"d_model": 16, "n_layers": 1, "n_heads": 2, "value_head": False}


def module(tree=None, actor=TREE_ACTOR, task=REVERSE, n_samples=None, **ppo):
    tree = {"segment_tokens": 2, "branches": 2, "depth": 3} if tree is None else tree
    leaves = TreeConfig(**tree).leaves if isinstance(tree, dict) else 4
    model = PPOModule(actor=actor, policy=POLICY, task=task, seed=4, ppo={
        "prompts_per_step": 2, "n_samples": n_samples or leaves, "minibatches": 2,
        "epochs": 1, "tree": tree, **ppo})
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():  # (a fresh policy's zero head is uniform: every draw alike)
        for p in model.policy.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=noise))
    return model


def response(ep):
    return [t for t, g in zip(ep.tokens, ep.generated) if g]


def nodes_of(ep):
    return [n for n, g in zip(ep.tree_node_ids, ep.generated) if g]


def segments(ep):
    """(node, its tokens, their log-probs) along the row, in order."""
    out = []
    for node, token, lp in zip(nodes_of(ep), response(ep), [
            lp for lp, g in zip(ep.logprobs, ep.generated) if g]):
        if not out or out[-1][0] != node:
            out.append((node, [], []))
        out[-1][1].append(token)
        out[-1][2].append(lp)
    return out


def check_tree(group):
    """Every node has one parent and one content in every row that passes it."""
    seen = {}
    for ep in group:
        parent = -1
        for node, tokens, logprobs in segments(ep):
            assert seen.setdefault(node, (parent, tokens, logprobs)) == (parent, tokens, logprobs)
            parent = node
    return seen


# ------------------------------------------------------------------ fixed segments

def test_fixed_trees_branch_after_each_segment_and_share_each_prefix_once():
    model = module()
    groups = model.rollout([0, 1, 2], generator(3, "rollout"))
    limit = model.max_new_tokens
    for group in groups:
        assert 1 <= len(group) <= 8
        nodes = check_tree(group)
        for ep in group:
            lengths = [len(tokens) for _, tokens, _ in segments(ep)]
            # every segment but a row's last has segment_tokens tokens; the last runs on
            assert all(n == 2 for n in lengths[:-1]) and len(lengths) <= 3
            if len(lengths) < 3:   # a path that stopped branching ended before the cut
                assert not ep.truncated and sum(lengths) <= 2 * len(lengths)
            assert len(response(ep)) <= limit
        # each node's tokens are counted once over the group
        assert sum(ep.sampled_tokens for ep in group) == sum(
            len(tokens) for _, tokens, _ in nodes.values())
        assert sum(ep.sampled_tokens for ep in group) < sum(len(response(ep)) for ep in group)
        children = {}
        for node, (parent, _, _) in nodes.items():
            children.setdefault(parent, []).append(node)
        assert all(len(c) == 2 for c in children.values())   # every branch point: branches
    assert any(len(segments(ep)) == 3 for group in groups for ep in group)


def test_every_token_keeps_the_log_prob_it_was_sampled_with():
    # The policy's own scoring of each row gives back the sampler's log-probs, on shared
    # tokens too (copied from the call that sampled them; a prefix is log-prob 0 there).
    model = module()
    batch, meta = model.make_batch(model.rollout([0, 1], generator(4, "rollout")))
    ids, mask = batch["input_ids"], batch["loss_mask"] > 0
    scored = model.policy.token_scores(ids, batch["attention_mask"].sum(1),
                                       ScoreRequest(frozenset({"logprobs"})))["logprobs"]
    # the batch's logprobs sit on the token they score; the scoring pass at the one before
    shifted = torch.nn.functional.pad(scored[:, :-1], (1, 0))
    assert (batch["logprobs"][mask] < 0).all()
    torch.testing.assert_close(batch["logprobs"][mask], shifted[mask], atol=1e-5, rtol=0)
    rows = torch.repeat_interleave(torch.arange(len(meta.traj_group_sizes)),
                                   torch.tensor(meta.traj_group_sizes))
    paths = tree_paths(batch["tree_node_ids"], batch["loss_mask"], ids, rows)
    assert paths.n_nodes > len(ids) and int(paths.lengths.max()) == 3


def test_the_update_runs_on_tree_rows_and_tree_credit_differs_between_segments():
    model = module()
    batch, meta = model.make_batch(model.rollout([0, 1], generator(5, "rollout")))
    out = model.advantage(batch, meta)
    adv, mask = out["advantages"], batch["loss_mask"] > 0
    assert torch.isfinite(adv).all()
    per_row = [set(adv[b][mask[b]].tolist()) for b in range(len(adv))]
    assert any(len(values) > 1 for values in per_row)   # credit per segment, not per row


def test_trees_are_drawn_from_the_step_generator():
    first = module().rollout([0], generator(7, "rollout"))
    again = module().rollout([0], generator(7, "rollout"))
    other = module().rollout([0], generator(8, "rollout"))
    assert [ep.tokens for ep in first[0]] == [ep.tokens for ep in again[0]]
    assert [ep.tokens for ep in first[0]] != [ep.tokens for ep in other[0]]


def test_depth_one_is_flat_sampling():
    model = module({"segment_tokens": 2, "branches": 4, "depth": 1})
    groups = model.rollout([0, 1], generator(2, "rollout"))
    for group in groups:
        assert len(group) == 4
        assert all(set(nodes_of(ep)) == {i} for i, ep in enumerate(group))
        assert all(ep.shared_tokens == 0 for ep in group)


# ------------------------------------------------------------------ entropy branching

def test_entropy_trees_branch_before_the_most_surprising_token():
    model = module({"segment_tokens": 2, "branches": 2, "depth": 2, "branch_at": "entropy"})
    groups = model.rollout([0, 1, 2], generator(3, "rollout"))
    for group in groups:
        nodes = check_tree(group)
        roots = [n for n, (parent, _, _) in nodes.items() if parent == -1]
        assert len(roots) <= 2 and len(group) <= 4
        for root in roots:
            rows = [ep for ep in group if nodes_of(ep)[0] == root]
            if len(rows) == 1:   # too short to branch
                assert len(response(rows[0])) <= 2
                continue
            assert len(rows) == 2
            _, shared, shared_lp = nodes[root]
            kept, other = rows   # the sampled continuation first, then the new one
            rest_lp = [lp for lp, g in zip(kept.logprobs, kept.generated) if g][len(shared):]
            # the cut: the lowest log-prob at least segment_tokens in, the earliest of equals
            assert len(shared) >= 2
            assert rest_lp[0] < min(shared_lp[2:], default=0.0)
            assert rest_lp[0] <= min(rest_lp)
            assert response(other)[:len(shared)] == response(kept)[:len(shared)]


# ------------------------------------------------------------------ a Hugging Face policy

def test_a_hugging_face_policy_samples_a_tree(tiny_lm):
    from lightning_adv.trainer.rollout.batch import score
    from tests.hf.test_hf_sampling import setup

    policy, runtime = setup(tiny_lm)
    request = GenerationRequest([0, 1], 4, 7, SamplingParams())
    groups = sample_tree(policy, runtime, request, TreeConfig(segment_tokens=2, depth=2),
                         generator(1, "hf"))
    score(groups, runtime)
    for group in groups:
        nodes = check_tree(group)
        assert len(group) <= 4 and len(nodes) > len(group)
        for ep in group:
            assert all(lp < 0 for lp in [lp for lp, g in zip(ep.logprobs, ep.generated) if g])
            assert len(ep.turns) == 1 and ep.turns[0].text == runtime.vocab.decode(
                [t for t in response(ep) if t not in runtime.vocab.eos_ids])


# ------------------------------------------------------------------ config errors

@pytest.mark.parametrize("tree, actor, task, n_samples, message", [
    (None, TREE_ACTOR, REVERSE, 4, "ppo.tree: the advantage stages read the batch key "
                                   "'tree_node_ids'"),
    ({"depth": 2}, {"kl_ctl": 0.0}, REVERSE, 4, "no stage reads it"),
    ({"depth": 2}, TREE_ACTOR, {"name": "guess"}, 4, "sampling through the environment is not supported"),
    ({"depth": 2}, TREE_ACTOR, REVERSE, 8, "ppo.n_samples: expected ppo.tree's leaves per "
                                           "prompt, branches ** depth = 2 ** 2 = 4, got 8"),
    ({"branches": 1, "depth": 2}, TREE_ACTOR, REVERSE, 1, "ppo.tree.branches: expected an "
                                                          "integer >= 2, got 1"),
    ({"branch_at": "random"}, TREE_ACTOR, REVERSE, 4, "ppo.tree.branch_at: expected one of"),
    ({"segment_tokens": 0}, TREE_ACTOR, REVERSE, 4, "ppo.tree.segment_tokens"),
    ({"width": 2}, TREE_ACTOR, REVERSE, 4, "ppo.tree: unknown keys ['width']"),
])
def test_config_errors_name_the_keys(tree, actor, task, n_samples, message):
    with pytest.raises(ValueError) as info:
        PPOModule(actor=actor, policy=POLICY, task=task, ppo={
            "prompts_per_step": 2, "n_samples": n_samples, "minibatches": 2, "tree": tree})
    assert message in str(info.value)


def test_tree_and_vine_are_refused_together():
    with pytest.raises(ValueError, match="ppo.tree: expected null with ppo.vine"):
        PPOModule(actor=TREE_ACTOR, policy=POLICY, task=REVERSE, ppo={
            "prompts_per_step": 2, "n_samples": 4, "minibatches": 2, "tree": {"depth": 2},
            "vine": {"k": 2}})


def test_without_a_tree_the_batch_has_no_node_ids_and_costs_its_tokens():
    model = PPOModule(actor={"kl_ctl": 0.0}, policy=POLICY, task=REVERSE,
                      ppo={"prompts_per_step": 2, "n_samples": 2, "minibatches": 2})
    groups = model.rollout([0], generator(1, "rollout"))
    batch, _ = model.make_batch(groups)
    assert "tree_node_ids" not in batch
    assert all(ep.sampled_tokens == len(response(ep)) for ep in groups[0])


# ------------------------------------------------------------------ a token budget

def test_a_token_budget_stops_the_run_after_the_step_that_reaches_it(tmp_path, capsys):
    import lightning.pytorch as pl

    from lightning_adv.trainer.run.callbacks import RunReport, SampledTokenBudget

    def run(budget, steps=20):
        model = module()
        trainer = pl.Trainer(max_epochs=1, limit_train_batches=steps, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, num_sanity_val_steps=0,
                             limit_val_batches=0,
                             callbacks=[SampledTokenBudget(budget), RunReport()],
                             default_root_dir=tmp_path)
        trainer.fit(model)
        return model

    first = run(1)   # any budget stops after the step that reaches it
    assert first.rollout_step == 1 and first.sampled_tokens > 0
    assert "20 training steps of 2 prompts x 8 samples (trainer.limit_train_batches x " \
           "max_epochs) (or 1 sampled tokens, if first)" in capsys.readouterr().out
    # the same seed samples the same first step: a budget at its total stops there, one
    # token more runs a second step
    assert run(first.sampled_tokens).rollout_step == 1
    second = run(first.sampled_tokens + 1)
    assert second.rollout_step == 2 and second.sampled_tokens > first.sampled_tokens + 1
    assert run(10 ** 9, steps=3).rollout_step == 3
    with pytest.raises(ValueError, match="SampledTokenBudget.max_tokens: expected a positive"):
        SampledTokenBudget(0)


def test_the_rollout_shape_counts_the_fewest_rows_a_tree_can_leave():
    # 2 prompts x 2 branches: every path may end in its first segment
    with pytest.raises(ValueError, match=r"ppo.minibatches: .* 4 rows per rank .*ppo.tree.branches"):
        module({"segment_tokens": 2, "branches": 2, "depth": 2}, minibatches=5)
    module({"segment_tokens": 2, "branches": 2, "depth": 2}, minibatches=4)


def test_several_ranks_refuse_micro_batches_of_tree_rows():
    from lightning_adv.trainer.setup import check_rollout_shape

    model = module({"segment_tokens": 2, "branches": 2, "depth": 2}, micro_batch_size=2)
    args = (model.actor_config, model.ppo_config, model.task_config, model.runtime)
    check_rollout_shape(*args, world_size=1)
    with pytest.raises(ValueError, match="ppo.micro_batch_size: with ppo.tree the ranks hold "
                                         "different numbers of rows.*got 2"):
        check_rollout_shape(*args, world_size=2)


def test_fsdp2_refuses_tree_rollouts_naming_both():
    from lightning_adv.trainer.policies.base import Policy
    from lightning_adv.trainer.policies.sharding import FSDP2Strategy, configure_sharding

    strategy = FSDP2Strategy()
    one_rank = type("Mesh", (), {"size": lambda self: 1})()
    strategy._device_mesh = {"tensor_parallel": one_rank, "data_parallel": one_rank}
    with pytest.raises(ValueError, match="ppo.tree: .*--trainer.strategy=ddp"):
        configure_sharding(strategy, Policy(), None, tree=True)


def test_groups_of_unequal_size_still_read_each_shared_prefix_once():
    # A tree that ends early leaves its group smaller; the scoring passes still get the
    # rows' prompts (the smallest group's size), and the shared-prefix pass gives the
    # plain pass's log-probs.
    from lightning_adv.trainer.rollout.step import prompt_groups

    model = module()
    batch, meta = model.make_batch(model.rollout([0, 1, 2], generator(3, "rollout")))
    assert len(set(meta.traj_group_sizes)) > 1
    prompts = prompt_groups(batch, meta)
    assert prompts is not None and prompts.size == min(meta.traj_group_sizes)
    lengths = batch["attention_mask"].sum(1)
    shared = model.policy.token_scores(batch["input_ids"], lengths, ScoreRequest(
        frozenset({"logprobs"}), 1.0, prompts))["logprobs"]
    plain = model.policy.token_scores(batch["input_ids"], lengths, ScoreRequest(
        frozenset({"logprobs"})))["logprobs"]
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=0)
