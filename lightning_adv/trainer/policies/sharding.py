"""Sharding a Hugging Face policy with FSDP2 (``fully_shard``) under Lightning.

``--trainer.strategy=fsdp2`` (:class:`FSDP2Strategy`, Lightning's ``ModelParallelStrategy``
with every rank a data-parallel rank) makes :meth:`PPOModule.configure_model
<lightning_adv.trainer.ppo.PPOModule.configure_model>` call :func:`shard_policies`:

- **Units.** ``fully_shard`` on every decoder layer (the classes the model lists in
  ``_no_split_modules``, as ``accelerate`` reads them), then on the root, the
  :class:`~lightning_adv.trainer.policies.hf.policy.HFPolicy` (embeddings, final norm, LM head,
  value head). A separate critic's layers are units of their own. The frozen reference
  policy is sharded the same way, and its root gives its weights back after each pass.
- **Sampling** reads the policy through :meth:`HFPolicy.decode_step` once per token, a
  different number of times on each rank (episodes end at different tokens), so no
  collective may run inside it: :func:`gathered_weights` all-gathers the policy's
  weights once before sampling (every rank, the same number of times) and frees them
  after it, as TRL's ``summon_full_params`` and verl's rollout weight sync do. Each rank
  then holds the full policy for the rollout's length; the scoring and update passes
  gather one layer at a time.
- **Saving.** A Lightning checkpoint is a directory of shards
  (``torch.distributed.checkpoint``, one file per rank, plus ``meta.pt``) that resumes
  on the same number of ranks or another; ``hf_model/`` is written by rank 0 from the
  full weights :func:`full_state_dict` gathers.

The gradients are those of DDP: each unit's gradients are reduce-scattered (averaged)
over the ranks, where DDP all-reduces them (``tests/distributed/test_fsdp.py`` compares
both, step by step).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry
from torch import Tensor, nn

#: the methods of a sharded policy that read its weights besides ``forward``
FORWARD_METHODS = ("decode_step", "reference_logits")


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` as plain FSDP2: every rank of every node is a
    data-parallel rank (its ``data_parallel_size`` defaults to the number of nodes and its
    ``tensor_parallel_size`` to the devices per node, a layout for tensor parallelism),
    no tensor parallelism. ``--trainer.strategy=fsdp2`` on the command line."""

    def __init__(self, save_distributed_checkpoint: bool = True, **kwargs: Any) -> None:
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1,
                         save_distributed_checkpoint=save_distributed_checkpoint, **kwargs)

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        self._tensor_parallel_size = 1
        super().setup_environment()


if "fsdp2" not in StrategyRegistry:
    StrategyRegistry.register(
        "fsdp2", FSDP2Strategy,
        description="FSDP2 (fully_shard per decoder layer and on the root) over every rank")


def data_parallel_mesh(strategy: ModelParallelStrategy) -> Any:
    """The strategy's data-parallel mesh; tensor parallelism is refused (the trainer's
    sampling and scoring assume each rank computes whole logits)."""
    mesh = strategy.device_mesh
    if mesh["tensor_parallel"].size() != 1:
        raise ValueError(f"trainer.strategy: tensor parallelism is not supported (the sampler "
                         f"and the scoring passes read whole logits on each rank); got "
                         f"tensor_parallel_size {mesh['tensor_parallel'].size()}. Use "
                         f"--trainer.strategy=fsdp2 (every rank data-parallel)")
    return mesh["data_parallel"]


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: modules of the classes it names in
    ``_no_split_modules`` (every transformers causal LM does), outermost only."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    found: list[nn.Module] = []
    for module in model.modules():
        if type(module).__name__ in names and not any(
                module in set(f.modules()) for f in found):
            found.append(module)
    return found


def shard_model(root: nn.Module, parts: list[nn.Module], mesh: Any,
                reshard_root: bool | None = None) -> None:
    """``fully_shard`` every decoder layer of each of ``parts``, then ``root``, and make
    :data:`FORWARD_METHODS` gather the root's weights as ``forward`` does."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    for part in parts:
        layers = decoder_layers(part)
        if not layers:
            raise ValueError(f"trainer.strategy: cannot shard {type(part).__name__}: it names no "
                             f"decoder layer class in _no_split_modules (FSDP2 shards one unit "
                             f"per decoder layer)")
        for layer in layers:
            fully_shard(layer, mesh=mesh)
    fully_shard(root, mesh=mesh, reshard_after_forward=reshard_root)
    for name in FORWARD_METHODS:
        if hasattr(root, name):
            register_fsdp_forward_method(root, name)


def is_sharded(module: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def shard_policies(policy: nn.Module, reference: Any, mesh: Any) -> None:
    """Shard the Hugging Face ``policy`` (and its separate critic) and the frozen
    ``reference`` (when it is a model of its own) over ``mesh``; idempotent."""
    if is_sharded(policy):
        return
    parts = [policy.model] + ([policy.critic] if policy.critic is not None else [])
    shard_model(policy, parts, mesh)
    if isinstance(reference, nn.Module) and not is_sharded(reference):
        # Its root's weights are freed after each pass too (the default keeps the root's
        # for the backward pass that follows; the reference has none).
        shard_model(reference, [reference.model], mesh, reshard_root=True)


@contextlib.contextmanager
def gathered_weights(policy: nn.Module) -> Iterator[None]:
    """Within the block every rank holds the full weights of a sharded ``policy``, so its
    passes run no collective (each rank may run a different number of them); a no-op for
    a policy that is not sharded. Enter and leave it on every rank."""
    if not is_sharded(policy):
        yield
        return
    units = [m for m in policy.modules() if is_sharded(m)]
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    for unit in units:
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            # the root keeps FSDP's default for a root: its weights stay gathered from the
            # forward pass to the backward pass right after it
            unit.set_reshard_after_forward(unit is not policy, recurse=False)


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """The full (unsharded) weights of a sharded ``module``, on CPU, on rank 0 (an empty
    dict on the other ranks). Collective: call it on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True,
                                                                 cpu_offload=True))


def configure_sharding(strategy: Any, policy: Any, reference: Any, tree: bool = False) -> None:
    """What ``PPOModule.configure_model`` does under ``strategy``: shard the policy under
    FSDP2 (:meth:`~lightning_adv.trainer.policies.base.Policy.shard`, which a policy that
    cannot be sharded refuses); refuse the strategies the trainer cannot run sharded, and
    FSDP2 with ``tree`` (``ppo.tree``)."""
    from lightning.pytorch.strategies import FSDPStrategy

    if isinstance(strategy, FSDPStrategy):
        raise ValueError("trainer.strategy: FSDP1 (fsdp) wraps the whole module, and the "
                         "trainer's sampler reads the policy outside its forward pass; use "
                         "--trainer.strategy=fsdp2 (FSDP2, fully_shard per decoder layer)")
    if not isinstance(strategy, ModelParallelStrategy):
        return
    if tree:
        # Every FSDP2 forward gathers weights, a collective: the ranks' passes must pair up,
        # and how many a rank makes (scoring chunks, micro-batches, prefix levels) follows
        # its row count, which a tree's early leaves make differ between ranks.
        raise ValueError("ppo.tree: a tree's rows per rank vary (a path that ends early is a "
                         "leaf), and FSDP2's passes are collectives every rank must make "
                         "alike; use --trainer.strategy=ddp with ppo.tree, or ppo.tree: null")
    policy.shard(strategy, reference)


class ShardingHooks:
    """The Lightning hook of :class:`~lightning_adv.trainer.ppo.PPOModule` for sharding
    (a mixin: the module holds ``policy`` and ``ref_policy``)."""

    def configure_model(self) -> None:
        """Under ``--trainer.strategy=fsdp2`` shard the Hugging Face policy, its critic and
        the reference policy (:func:`configure_sharding`); otherwise nothing."""
        if self._trainer is not None:
            configure_sharding(self.trainer.strategy, self.policy, self.ref_policy,
                               tree=self.ppo_config.tree is not None)


def unsharded_lora_copy(model: nn.Module, state: dict[str, Tensor]) -> nn.Module:
    """A ``peft`` model of ``model``'s architecture and adapters holding the full weights
    ``state`` (its gathered state dict), on CPU. (Built on the meta device, the copy would
    lack the buffers its constructor computes, such as the rotary frequencies.)"""
    from peft import get_peft_model

    base = model.get_base_model()
    with torch.random.fork_rng(devices=[]):  # (its random initial weights are overwritten)
        unsharded = get_peft_model(type(base)(base.config),
                                   copy.deepcopy(model.peft_config["default"]))
    dtype = next((v.dtype for v in state.values() if v.is_floating_point()), None)
    unsharded.load_state_dict(state, strict=True)
    return unsharded.to(dtype=dtype) if dtype is not None else unsharded
