"""One training step's rollout: sampling and scoring episodes, and the SPEC §1 batch.

- :mod:`.step`: the step's rollout (:class:`~.step.Rollout`);
- :mod:`.batch`: scoring episodes, and the batch made of them;
- :mod:`.scoring`: the scoring passes of the policy and the reference over the batch;
- :mod:`.recipe_inputs`: optional batch keys some stages read;
- :mod:`.vine`: ``ppo.vine``'s continuations from each step boundary (``mc_returns``);
- :mod:`.tree`: ``ppo.tree``'s tree rollouts (``tree_node_ids``);
- :mod:`.dynamic_sampling` and :mod:`.off_policy`: DAPO's dynamic sampling, and the
  off-policy queue of stale rollouts.
"""
