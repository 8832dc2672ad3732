"""``python -m lightning_adv.bench_hf``: sampling tokens/s from a Hugging Face policy, with and
without the KV cache, side by side in one process.

Times the trainer's sampler (:func:`~lightning_adv.trainer.hf_sampling.hf_generate`) with
its KV cache and re-reading every prefix (``ppo.kv_cache: false``), and for reference
``transformers``' own ``generate(do_sample=True, top_k=0)`` with ``use_cache`` on and off,
on the same left-padded chat prompts of the ``reverse`` task. Both sampler variants draw
the same tokens from the same generator, so their work is the same. Without ``--model``
it builds the tiny model of ``python -m lightning_adv.hf make-tiny`` in a temporary
directory::

    python -m lightning_adv.bench_hf --batch 16 --new-tokens 32 128 --threads 1 2

Tokens/s counts generated tokens (every row's, EOS included) over wall time; each number
is the best of ``--repeats`` runs after a warm-up run, as the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any, Callable, Optional, Sequence

VARIANTS = ("trainer sampler", "transformers generate")


def _best(fn: Callable[[], int], repeats: int) -> tuple[float, int]:
    """(best seconds, tokens generated) over ``repeats`` runs of ``fn``, after one untimed
    warm-up run (first calls pay for lazy initialisation)."""
    fn()
    best, tokens = float("inf"), 0
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = fn()
        best = min(best, time.perf_counter() - start)
    return best, tokens


def _sampler_run(policy: Any, runtime: Any, batch: int, new_tokens: int, kv_cache: bool
                 ) -> Callable[[], int]:
    from lightning_adv.trainer.data import generator
    from lightning_adv.trainer.hf_sampling import SamplingParams, hf_generate

    def run() -> int:
        groups = hf_generate(policy, runtime, list(range(batch)), 1, new_tokens, SamplingParams(),
                             generator(0, "bench"), kv_cache=kv_cache)
        return sum(ep.generated.count(True) for g in groups for ep in g)
    return run


def _generate_run(policy: Any, runtime: Any, batch: int, new_tokens: int, kv_cache: bool
                  ) -> Callable[[], int]:
    import torch

    tokenizer = runtime.vocab
    prompts = [runtime.instance(i)[1] for i in range(batch)]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[tokenizer.pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])

    def run() -> int:
        torch.manual_seed(0)
        out = policy.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=0,
                                    top_p=1.0, max_new_tokens=new_tokens, use_cache=kv_cache,
                                    pad_token_id=tokenizer.pad_id,
                                    eos_token_id=sorted(tokenizer.eos_ids))
        new = out[:, width:]
        ended = torch.isin(new, torch.tensor(sorted(tokenizer.eos_ids)))
        # tokens up to and including each row's first EOS (generate pads after it)
        first = torch.where(ended.any(1), ended.float().argmax(1) + 1, new.shape[1])
        return int(first.sum())
    return run


def run(model_dir: str, batch: int, new_tokens: Sequence[int], threads: Sequence[int],
        repeats: int) -> str:
    import torch

    from lightning_adv.trainer.hf_policy import build_hf_policy, check_hf_policy
    from lightning_adv.trainer.policy import PolicyConfig
    from lightning_adv.trainer.tasks import TaskConfig, TaskRuntime

    config = PolicyConfig(pretrained=model_dir, value_head=False)
    setup = check_hf_policy(config)
    runtime = TaskRuntime(TaskConfig(name="reverse"), tokenizer=setup.tokenizer)
    policy = build_hf_policy(config, seed=0).eval()
    model = policy.model.config
    lines = [f"{model.model_type}, {model.num_hidden_layers} layers, width {model.hidden_size}, "
             f"vocabulary {model.vocab_size}; batch {batch} (left-padded chat prompts); "
             f"best of {repeats}"]
    makers = {"trainer sampler": _sampler_run, "transformers generate": _generate_run}
    for n_threads in threads:
        torch.set_num_threads(n_threads)
        for n in new_tokens:
            lines.append(f"{n} new tokens, {n_threads} thread(s):")
            lines.append(f"  {'':22s} {'KV cache':>14s} {'no cache':>14s} {'speed-up':>9s}")
            for name in VARIANTS:
                (cached, tokens), (plain, plain_tokens) = (
                    _best(makers[name](policy, runtime, batch, n, kv), repeats)
                    for kv in (True, False))
                lines.append(f"  {name:22s} {tokens / cached:10.0f} t/s {plain_tokens / plain:10.0f}"
                             f" t/s {plain / cached * tokens / max(plain_tokens, 1):8.2f}x")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lightning_adv.bench_hf",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="causal LM directory (default: a fresh tiny model)")
    parser.add_argument("--batch", type=int, default=16, help="sequences sampled at once")
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if model_dir is None:
            from lightning_adv.hf import make_tiny

            model_dir = str(make_tiny(os.path.join(tmp, "tiny_lm")))
        print(run(model_dir, args.batch, args.new_tokens, args.threads, args.repeats))


if __name__ == "__main__":
    main()
