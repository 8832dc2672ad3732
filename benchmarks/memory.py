"""Peak memory of the trainer's scoring pass and of its update with a large-vocabulary
Hugging Face policy, against both at a baseline commit.

Writes a tiny random model with a real vocabulary size (``--vocab 32000``, width
``--hidden 32``; the tokenizer of this checkout's ``make-tiny`` command, which holds
fewer tokens: the episodes use ids over the whole vocabulary), then, each in a fresh
process, builds a ``PPOModule`` on it (a value head, a KL penalty, so a reference pass,
``actor.recompute_logprob``, so the policy's log-probs too, and an entropy bonus) and on
``--batch`` episodes of ``--seq`` tokens runs once

- ``scoring``: ``make_batch``, the policy's pass (values, ``prox_logp``) and the
  reference's (``ref_logp``), at ``ppo.forward_batch_size`` = each of ``--sizes``;
- ``update``: the update (``updater.step``; ``update`` in trees before the Policy
  interface) with one minibatch of all rows and one epoch (a backward pass
  through the policy; SGD at lr 0, no Trainer), at ``ppo.micro_batch_size`` = each of
  ``--sizes``, on the same rollout batch for every version.

The package at ``--baseline`` (default ``a7e96eb``; extracted with ``git archive``) is
measured alike, at ``--baseline-sizes`` (``none`` alone for commits before those keys,
such as ``0718eb3``)::

    python benchmarks/memory.py --vocab 32000 --hidden 32 --batch 16 --seq 256

Peak: the process's peak resident set during the pass (``VmHWM``, reset just before it:
:func:`peak_mib`), minus its resident set just before it (after a small warm-up pass),
in MiB. torch's CPU allocator hands blocks straight to and from glibc, and the child
processes run with ``MALLOC_MMAP_THRESHOLD_=1048576`` so that every block of 1 MiB or
more goes back to the system when freed: the peak is then the most memory the pass held
at once. One float32 copy of the logits is ``batch x seq x vocab x 4`` bytes.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import harness

DEFAULT_BASELINE = "a7e96eb"
PROMPT_TOKENS = 16
#: glibc maps blocks of this size and more one by one, so freeing one unmaps it: the
#: resident set follows the live tensors (glibc otherwise keeps freed blocks of up to
#: 32 MiB in its heap, and the peak would depend on the order of frees).
MMAP_THRESHOLD = 2**20


# ---------------------------------------------------------------------------- child side


def write_model(tree: Path, directory: Path, vocab: int, hidden: int) -> Path:
    """A random 2-layer model of ``vocab`` tokens and width ``hidden``, with the tokenizer
    of ``tree``'s ``make-tiny`` command."""
    harness.make_tiny_model(tree, directory)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()  # (save_pretrained draws one even for one shard)

    config = AutoConfig.from_pretrained(directory)
    config.vocab_size, config.hidden_size, config.intermediate_size = vocab, hidden, 4 * hidden
    config.num_attention_heads, config.num_key_value_heads = 4, 2
    if getattr(config, "head_dim", None) is not None:
        config.head_dim = hidden // 4
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(directory)
    return directory


def episodes(batch: int, seq: int, vocab: int, group: int = 4) -> list[list[Any]]:
    """``batch`` episodes of ``seq`` random tokens (lengths seq/2..seq: the batch is
    padded), in prompt groups of ``group``."""
    import torch

    try:
        from lightning_adv.trainer.tasks.episode import Episode
    except ImportError:  # a baseline from before the trainer's sub-packages
        from lightning_adv.trainer.sampling import Episode

    g = torch.Generator().manual_seed(0)
    groups = []
    for start in range(0, batch, group):
        rows = []
        for row in range(start, min(start + group, batch)):
            n = seq - (row * seq // (2 * batch))
            tokens = torch.randint(vocab, (n,), generator=g).tolist()
            generated = [i >= PROMPT_TOKENS for i in range(n)]
            rows.append(Episode(index=start // group, instance=None, tokens=tokens,
                                generated=generated, logprobs=[0.0] * n,
                                turn_ids=[0 if gen else -1 for gen in generated], turns=[]))
        groups.append(rows)
    return groups


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mib(fn: Callable[[], Any]) -> tuple[Any, float]:
    """``fn()`` and the most MiB of resident memory above this process's resident set
    before it that the call held at once.

    The peak is the kernel's high-water mark (``VmHWM``) reset to the current resident
    set just before the call (``/proc/self/clear_refs``). ``ru_maxrss`` cannot serve: it
    is the process's lifetime peak, and a child started by fork and exec starts with its
    parent's, so a pass smaller than the parent's peak would read as the parent's."""
    before = _rss_mib()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak resident set to the current one
    except OSError as err:
        raise RuntimeError(f"peak_mib: resetting the peak resident set through "
                           f"/proc/self/clear_refs failed ({err}); this needs Linux") from err
    out = fn()
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return out, peak / 1024 - before


def ppo_module(model_dir: str, dtype: str, ppo_extra: dict[str, Any]) -> Any:
    """A ``PPOModule`` of this process's ``lightning_adv`` (critic, KL penalty, recomputed
    log-probs, an entropy bonus with its gradient) that runs its update without a Trainer:
    plain ``backward`` and SGD at lr 0."""
    import torch

    from lightning_adv import ActorConfig
    from lightning_adv.trainer import PPOConfig, PPOModule, PolicyConfig

    class Standalone(PPOModule):
        def optimizers(self) -> Any:
            return self.sgd

        def manual_backward(self, loss: Any, *args: Any, **kwargs: Any) -> None:
            loss.backward()

    ppo = {"prompts_per_step": 4, "n_samples": 4, "minibatches": 1, "epochs": 1,
           "entropy_coef": 0.01, "max_grad_norm": None, **ppo_extra}
    module = Standalone(policy=PolicyConfig(pretrained=model_dir, dtype=dtype),
                        actor=ActorConfig(kl_ctl=0.05, recompute_logprob=True),
                        ppo=PPOConfig(**ppo), seed=0)
    module.sgd = torch.optim.SGD(module.policy.parameters(), lr=0.0)
    return module


def _update(module: Any, batch: dict[str, Any], out: dict[str, Any], gen: Any) -> None:
    """One update of ``module`` on the scored ``batch``: ``module.updater.step``, or
    ``module.update`` in a tree before the Policy interface (a baseline commit)."""
    updater = getattr(module, "updater", None)
    if updater is not None:
        updater.step(batch, out, gen, module)
    else:
        module.update(batch, out, gen)


def _scored(module: Any, groups: list[list[Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    batch, meta = module.make_batch(groups)
    return batch, dict(module.advantage(batch, meta))


def measure(args: argparse.Namespace) -> dict[str, float]:
    """Peak MiB and seconds of one ``make_batch`` (phase ``scoring``, ``--size`` =
    ``ppo.forward_batch_size``) or one update (phase ``update``, on the batch that phase
    ``inputs`` saved in ``--inputs``; ``--size`` = ``ppo.micro_batch_size``) in this
    process (a child in one tree)."""
    harness.set_thread_environment(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    harness.check_package_home(Path.cwd())
    key = {"scoring": "forward_batch_size", "update": "micro_batch_size"}.get(args.child)
    module = ppo_module(args.model, args.dtype, {} if args.size is None else {key: args.size})
    vocab = module.policy.config.vocab_size
    warm = _scored(module, episodes(2, 8, vocab))  # lazy initialisation, thread pools
    if args.child == "inputs":
        torch.save(_scored(module, episodes(args.batch, args.seq, vocab)), args.inputs)
        return {}
    if args.child == "update":
        _update(module, *warm, torch.Generator().manual_seed(0))
        scored = torch.load(args.inputs, weights_only=False)
        module.sgd.zero_grad(set_to_none=False)  # the gradients' memory is not the pass's
        start = time.perf_counter()
        _, peak = peak_mib(lambda: _update(module, *scored, torch.Generator().manual_seed(0)))
    else:
        groups = episodes(args.batch, args.seq, vocab)
        start = time.perf_counter()
        batch, peak = peak_mib(lambda: module.make_batch(groups)[0])
        if not {"values", "prox_logp", "ref_logp"} <= set(batch):
            raise RuntimeError(f"make_batch returned {sorted(batch)}: not the three passes")
    return {"peak_mib": peak, "seconds": time.perf_counter() - start}


# ---------------------------------------------------------------------------- parent side


def run_in_tree(tree: Path, phase: str, size: Optional[int], args: argparse.Namespace,
                model_dir: Path, dtype: str, inputs: Path) -> dict[str, float]:
    """:func:`measure` in a fresh interpreter importing ``lightning_adv`` from ``tree``:
    the peak resident set is the process's own."""
    command = [str(Path(__file__).resolve()), "--child", phase, "--model", str(model_dir),
               "--batch", str(args.batch), "--seq", str(args.seq), "--dtypes", dtype,
               "--threads", str(args.threads), "--inputs", str(inputs)]
    if size is not None:
        command += ["--size", str(size)]
    return harness.run_child(command, tree, args.threads, f"measuring {phase} in {tree}",
                             {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)})


def _size(text: str) -> Optional[int]:
    return None if text.lower() in ("none", "null") else int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python benchmarks/memory.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16, help="episodes (rows)")
    parser.add_argument("--seq", type=int, default=256, help="tokens of the longest episode")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--phases", nargs="+", default=["scoring", "update"],
                        choices=["scoring", "update"])
    parser.add_argument("--sizes", type=_size, nargs="+", default=[None, 4, 1],
                        help="ppo.forward_batch_size (scoring) and ppo.micro_batch_size "
                             "(update) values to measure (none: the whole batch)")
    parser.add_argument("--baseline", default=DEFAULT_BASELINE,
                        help=f"the commit to compare with (default {DEFAULT_BASELINE}; '' to "
                             f"skip it)")
    parser.add_argument("--baseline-sizes", type=_size, nargs="+",
                        help="the sizes measured at the baseline (default: --sizes)")
    parser.add_argument("--no-build", action="store_true",
                        help="run the baseline without compiling its C extension")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--page", type=Path, help="also write the results as a markdown page")
    parser.add_argument("--child", choices=["inputs", "scoring", "update"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--inputs", help=argparse.SUPPRESS)
    return parser


def compare(args: argparse.Namespace, tmp: Path) -> None:
    versions = [("this checkout", harness.ROOT, args.sizes)]
    if args.baseline:
        tree = harness.prepare_tree(args.baseline, tmp / "baseline", build=not args.no_build)
        versions.insert(0, (args.baseline, tree, args.baseline_sizes or args.sizes))
    model_dir = write_model(harness.ROOT, tmp / "model", args.vocab, args.hidden)
    copy_mib = args.batch * args.seq * args.vocab * 4 / 2**20
    header = harness.page_header("Peak memory of the scoring pass and the update", [
        f"Threads: {harness.thread_note([args.threads])}; MALLOC_MMAP_THRESHOLD_="
        f"{MMAP_THRESHOLD} in the measuring processes",
        f"Model: vocabulary {args.vocab}, width {args.hidden}, 2 layers; {args.batch} rows "
        f"× {args.seq} tokens: one float32 copy of the logits is {copy_mib:.0f} MiB",
        *(harness.tree_note(name, tree) for name, tree, _ in versions)])
    print(header, flush=True)
    rows = []
    for dtype in args.dtypes:
        inputs = tmp / f"inputs_{dtype}.pt"
        if "update" in args.phases:  # the same rollout batch for every version
            run_in_tree(harness.ROOT, "inputs", None, args, model_dir, dtype, inputs)
        for phase in args.phases:
            for name, tree, sizes in versions:
                for size in sizes:
                    got = run_in_tree(tree, phase, size, args, model_dir, dtype, inputs)
                    rows.append([phase, name, dtype, "whole batch" if size is None else str(size),
                                 f"{got['peak_mib']:.0f}", f"{got['seconds']:.3f}"])
                    print(" | ".join(rows[-1]), flush=True)
    harness.write_page(args.page, header, [
        "Peak: the most resident memory one pass held above the process's before it, in "
        "MiB; rows per pass: `ppo.forward_batch_size` (scoring) or `ppo.micro_batch_size` "
        "(update).\n\n" + harness.table(["phase", "version", "dtype", "rows per pass",
                                         "peak MiB", "seconds"], rows)],
        deterministic="The peaks depend on the code, the model and the sizes only, up to a "
                      "few MiB of allocator noise; the seconds are timings.")


def main(argv: Optional[list[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.child is not None:
        args.dtype = args.dtypes[0]
        harness.report_result(measure(args))
        return
    if min(args.vocab, args.hidden, args.batch, args.seq, args.threads) < 1:
        parser.error("--vocab, --hidden, --batch, --seq and --threads must be at least 1")
    if args.hidden % 4:
        parser.error(f"--hidden: expected a multiple of 4 (4 attention heads), got {args.hidden}")
    harness.set_thread_environment(args.threads)  # (the children inherit it)
    with tempfile.TemporaryDirectory(prefix="memory_") as tmp:
        compare(args, Path(tmp))


if __name__ == "__main__":
    main(sys.argv[1:])
