"""Two gloo processes that shard Hugging Face policies with
:func:`lightning_adv.trainer.policies.sharding.shard_policies` and compare every pass with an
unsharded copy of the same weights (the worker of ``tests/distributed/test_sharding.py``).

Each rank writes ``rank<r>.pt``: per case, how every weight is held, the largest
differences from the unsharded copy (forward, reference, gradients, decoding, the
gathered state dict) and what the sampler's passes did."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lightning_adv.trainer.policies.base import ScoreRequest
from lightning_adv.trainer.policies.hf.policy import build_hf_policy
from lightning_adv.trainer.policies.config import PolicyConfig

#: policies with a value head on the shared trunk, with a separate critic model, and
#: with LoRA adapters (the reference: the policy with its adapters disabled)
CASES = {
    "value_head": {"value_head": True},
    "critic": {"value_head": True, "critic_pretrained": "MODEL"},
    "lora": {"value_head": True, "lora": {"r": 4, "target_modules": ["q_proj", "v_proj"]}},
}


def perturb(module: torch.nn.Module, seed: int) -> None:
    """Move every trainable weight (a zero value head, zero LoRA B) somewhere non-trivial."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn(p.shape, generator=gen))


def rows(rank: int) -> torch.Tensor:
    """This rank's batch: right-padded token ids, different on each rank."""
    gen = torch.Generator().manual_seed(100 + rank)
    ids = torch.randint(3, 250, (3, 7), generator=gen)
    ids[1, 5:] = 0
    return ids


def logprobs_of(scored: Any, ids: torch.Tensor) -> torch.Tensor:
    """The next-token log-probs of a policy or reference (``token_scores``)."""
    lengths = (ids != 0).sum(1)
    return scored.token_scores(ids, lengths, ScoreRequest(frozenset({"logprobs"})))["logprobs"]


def loss_of(logits: torch.Tensor, values: Any) -> torch.Tensor:
    loss = logits.log_softmax(-1)[..., 5].mean()
    return loss + (values.square().mean() if values is not None else 0.0)


def held(module: torch.nn.Module) -> dict[str, tuple[str, ...]]:
    from torch.distributed.tensor import DTensor

    return {name: tuple(f"{type(p).__name__}({getattr(p, 'dim', '')})" for p in t.placements)
            if isinstance(t, DTensor) else ("plain",)
            for name, t in module.state_dict().items()}


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).abs().max())


def run_case(name: str, config: PolicyConfig, mesh: Any, rank: int) -> dict[str, Any]:
    from lightning_adv.trainer.policies.sharding import full_state_dict, gathered_weights, shard_policies

    policy, full = (build_hf_policy(config, seed=0) for _ in range(2))
    reference, full_reference = policy.reference(), full.reference()
    perturb(policy, 1)  # (after the reference is taken: the policy has moved away from it)
    perturb(full, 1)
    shard_policies(policy, reference, mesh)
    out: dict[str, Any] = {"policy": held(policy)}
    if isinstance(reference, torch.nn.Module):
        out["reference"] = held(reference)
    ids = rows(rank)
    logits, values = policy(ids)
    expected_logits, expected_values = full(ids)
    out["forward"] = max(max_diff(logits, expected_logits), max_diff(values, expected_values))
    with torch.no_grad():
        out["reference_pass"] = max_diff(logprobs_of(reference, ids),
                                         logprobs_of(full_reference, ids))
        out["reference_moves"] = max_diff(logprobs_of(full_reference, ids),
                                          logprobs_of(full, ids))
    loss_of(logits, values).backward()
    # FSDP averages the ranks' gradients (as DDP does): the unsharded copy's gradient of
    # the mean of both ranks' losses
    (sum(loss_of(*full(rows(r))) for r in range(dist.get_world_size()))
     / dist.get_world_size()).backward()
    expected_grads = {n: p.grad for n, p in full.named_parameters() if p.requires_grad}
    grads = {n: p.grad.full_tensor() for n, p in policy.named_parameters() if p.requires_grad}
    out["grad_names"] = sorted(grads) == sorted(expected_grads)
    out["grads"] = max(max_diff(grads[n], expected_grads[n]) for n in expected_grads)
    out["grad_scale"] = max(float(g.abs().max()) for g in expected_grads.values())
    # Decoding: rank r reads r + 2 tokens one by one, a different number of passes on each
    # rank, which only works when no pass runs a collective.
    with torch.no_grad(), gathered_weights(policy):
        cache = expected_cache = None
        steps = []
        for t in range(rank + 2):
            token, mask = ids[:1, t:t + 1], torch.ones(1, t + 1, dtype=torch.long)
            position = torch.tensor([[t]])
            got, cache = policy.decode_step(token, mask, position, cache)
            want, expected_cache = full.decode_step(token, mask, position, expected_cache)
            steps.append(max_diff(got, want))
    out["decode"] = max(steps)
    out["decode_steps"] = len(steps)
    state = full_state_dict(policy)
    if rank == 0:
        expected = full.state_dict()
        out["state_keys"] = sorted(state) == sorted(expected)
        out["state"] = max(max_diff(state[k], expected[k]) for k in expected)
        out["state_plain"] = not any(type(v).__name__ == "DTensor" for v in state.values())
    else:
        out["state_keys"] = state == {}
    return out


def worker(rank: int, world: int, init_file: str, model: str, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        results = {}
        for name, fields in CASES.items():
            fields = {k: (model if v == "MODEL" else v) for k, v in fields.items()}
            results[name] = run_case(name, PolicyConfig(pretrained=model, **fields), mesh, rank)
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
