"""``python -m lightning_adv.bench_memory``: peak memory of the trainer's scoring pass and of
its update with a large-vocabulary Hugging Face policy, against both as they were at an
earlier commit.

Writes a tiny random Qwen2 model with a real vocabulary size (``--vocab 32000``, width
``--hidden 32``), then, each in a fresh process, builds a ``PPOModule`` on it (a value
head, a KL penalty, so a reference pass, ``actor.recompute_logprob``, so the policy's
log-probs too, and an entropy bonus) and on ``--batch`` episodes of ``--seq`` tokens runs
once

- ``scoring``: ``make_batch``, the policy's pass (values, ``prox_logp``) and the
  reference's (``ref_logp``), at ``ppo.forward_batch_size`` = each of ``--sizes``;
- ``update``: ``update`` with one minibatch of all rows and one epoch (a backward pass
  through the policy; SGD at lr 0, no Trainer), at ``ppo.micro_batch_size`` = each of
  ``--sizes``, on the same rollout batch for every version.

The package at ``--baseline`` (extracted with ``git archive``, as ``bench_trainer`` does;
it has neither key) is measured alike::

    python -m lightning_adv.bench_memory --vocab 32000 --hidden 32 --batch 16 --seq 256

Peak: the process's peak resident set during the pass (``VmHWM``, reset just before it:
:func:`peak_mib`), minus its resident set just before it (after a small warm-up pass),
in MiB. torch's CPU allocator hands blocks straight to and from glibc, and the child
processes run with ``MALLOC_MMAP_THRESHOLD_=1048576`` so that every block of 1 MiB or
more goes back to the system when freed: the peak is then the most memory the pass held at once. One float32
copy of the logits is ``batch x seq x vocab x 4`` bytes.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any, Optional

from lightning_adv.bench_trainer import run_reporting

#: the commit before chunked scoring passes and chunked log-prob reductions
DEFAULT_BASELINE = "0718eb3"
PROMPT_TOKENS = 16


def write_model(directory: Path, vocab: int, hidden: int) -> Path:
    """A random 2-layer Qwen2 of ``vocab`` tokens (the tokenizer holds fewer; the episodes
    below use ids over the whole vocabulary)."""
    from lightning_adv.hf import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    model = build_model(vocab, tokenizer.eos_token_id, tokenizer.pad_token_id,
                        hidden_size=hidden, heads=4, kv_heads=2, intermediate_size=4 * hidden)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _episodes(batch: int, seq: int, vocab: int, group: int = 4) -> list[list[Any]]:
    """``batch`` episodes of ``seq`` random tokens (lengths seq/2..seq: the batch is
    padded), in prompt groups of ``group``."""
    import torch

    from lightning_adv.trainer.sampling import Episode

    g = torch.Generator().manual_seed(0)
    groups = []
    for start in range(0, batch, group):
        episodes = []
        for row in range(start, min(start + group, batch)):
            n = seq - (row * seq // (2 * batch))
            tokens = torch.randint(vocab, (n,), generator=g).tolist()
            generated = [i >= PROMPT_TOKENS for i in range(n)]
            episodes.append(Episode(index=start // group, instance=None, tokens=tokens,
                                    generated=generated, logprobs=[0.0] * n,
                                    turn_ids=[0 if gen else -1 for gen in generated], turns=[]))
        groups.append(episodes)
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
        raise RuntimeError(f"bench_memory: resetting the peak resident set through "
                           f"/proc/self/clear_refs failed ({err}); the bench needs Linux") from err
    out = fn()
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return out, peak / 1024 - before


def _module(model_dir: str, dtype: str, ppo_extra: dict[str, Any]) -> Any:
    """A ``PPOModule`` of this process's ``lightning_adv`` (critic, KL penalty, recomputed
    log-probs, an entropy bonus with its gradient) that runs ``update`` without a Trainer:
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


def _scored(module: Any, groups: list[list[Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    batch, meta = module.make_batch(groups)
    return batch, dict(module.advantage(batch, meta))


def measure(model_dir: str, batch: int, seq: int, dtype: str, phase: str,
            size: Optional[int], inputs: str) -> dict[str, float]:
    """Peak MiB and seconds of one ``make_batch`` (``phase`` "scoring", ``size`` =
    ``ppo.forward_batch_size``) or one ``update`` ("update", on the batch saved in
    ``inputs`` by phase "inputs"; ``size`` = ``ppo.micro_batch_size``) in this process,
    with whichever ``lightning_adv`` it imports (the baseline's has neither key)."""
    import torch

    key = {"scoring": "forward_batch_size", "update": "micro_batch_size"}.get(phase)
    module = _module(model_dir, dtype, {} if size is None else {key: size})
    vocab = module.policy.config.vocab_size
    warm = _scored(module, _episodes(2, 8, vocab))  # lazy initialisation, thread pools
    if phase == "inputs":
        torch.save(_scored(module, _episodes(batch, seq, vocab)), inputs)
        return {}
    if phase == "update":
        module.update(*warm, torch.Generator().manual_seed(0))
        scored = torch.load(inputs, weights_only=False)
        module.sgd.zero_grad(set_to_none=False)  # the gradients' memory is not the pass's
    else:
        groups = _episodes(batch, seq, vocab)
    start = time.perf_counter()
    if phase == "update":
        _, peak = peak_mib(lambda: module.update(*scored, torch.Generator().manual_seed(0)))
    else:
        batch, peak = peak_mib(lambda: module.make_batch(groups)[0])
        assert {"values", "prox_logp", "ref_logp"} <= set(batch)
    seconds = time.perf_counter() - start
    return {"peak_mib": peak, "seconds": seconds}


def run_in_process(source: Path, model_dir: Path, batch: int, seq: int, dtype: str,
                   phase: str, size: Optional[int], threads: int, inputs: Path
                   ) -> dict[str, float]:
    """:func:`measure` in a fresh interpreter importing ``lightning_adv`` from ``source``:
    the peak resident set is the process's own."""
    code = (f"import json, runpy, sys, torch; torch.set_num_threads({threads}); "
            f"sys.path.insert(0, {str(source)!r}); "
            f"import lightning_adv; assert lightning_adv.__file__.startswith({str(source)!r}); "
            f"m = runpy.run_path({__file__!r})['measure']; "
            f"print('MEMORY', json.dumps(m({str(model_dir)!r}, {batch}, {seq}, {dtype!r}, "
            f"{phase!r}, {size!r}, {str(inputs)!r})))")
    # Blocks of 1 MiB and more are mapped and unmapped one by one, so the resident set
    # follows the live tensors (glibc otherwise keeps freed blocks of up to 32 MiB in its
    # heap, and the peak depends on the order of frees).
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "HF_HUB_OFFLINE": "1",
           "MALLOC_MMAP_THRESHOLD_": str(2**20)}
    env.pop("PYTHONPATH", None)
    return run_reporting(code, env, source, "MEMORY", f"measuring {source}")


def _size(text: str) -> Optional[int]:
    return None if text.lower() in ("none", "null") else int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lightning_adv.bench_memory",
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
                        help="the commit to compare with ('' to skip it)")
    parser.add_argument("--threads", type=int, default=1)
    return parser


def main(argv: Optional[list[str]] = None) -> None:
    # (imported here: this file also runs inside the baseline's process)
    from lightning_adv.bench_trainer import ROOT, extract

    args = build_parser().parse_args(argv)
    copy_mib = args.batch * args.seq * args.vocab * 4 / 2**20
    print(f"vocab {args.vocab}, width {args.hidden}, {args.batch} rows x {args.seq} tokens: "
          f"one float32 copy of the logits is {copy_mib:.0f} MiB; {args.threads} thread(s)")
    print(f"{'phase':>8} {'version':>10} {'dtype':>9} {'rows per pass':>13} {'peak MiB':>9} "
          f"{'s':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model(Path(tmp) / "model", args.vocab, args.hidden)
        versions = [("now", ROOT, args.sizes)]
        if args.baseline:
            old = Path(tmp) / "old"
            old.mkdir()
            versions.insert(0, (args.baseline, extract(args.baseline, old), [None]))
        for dtype in args.dtypes:
            inputs = Path(tmp) / f"inputs_{dtype}.pt"
            if "update" in args.phases:  # the same rollout batch for every version
                run_in_process(ROOT, model_dir, args.batch, args.seq, dtype, "inputs", None,
                               args.threads, inputs)
            for phase in args.phases:
                for name, source, sizes in versions:
                    for size in sizes:
                        got = run_in_process(source, model_dir, args.batch, args.seq, dtype,
                                             phase, size, args.threads, inputs)
                        label = "whole batch" if size is None else str(size)
                        print(f"{phase:>8} {name:>10} {dtype:>9} {label:>13} "
                              f"{got['peak_mib']:>9.0f} {got['seconds']:>7.3f}", flush=True)


if __name__ == "__main__":
    main()
