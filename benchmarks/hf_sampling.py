"""Sampling tokens/s from a Hugging Face policy, with and without the KV cache, side by
side in one process.

Times the trainer's sampler (``lightning_adv.trainer.policies.hf.sampling.hf_generate``) with its
KV cache and re-reading every prefix (``ppo.kv_cache: false``), and for reference
``transformers``' own ``generate(do_sample=True, top_k=0)`` with ``use_cache`` on and off,
on the same left-padded chat prompts of the ``reverse`` task. Both sampler variants draw
the same tokens from the same generator, so their work is the same. Without ``--model``
it samples from the tiny model this checkout's ``make-tiny`` command writes::

    python benchmarks/hf_sampling.py --batch 16 --new-tokens 32 128 --threads 1 2

Tokens/s counts generated tokens (every row's, EOS included) over wall time; each number
is the best of ``--repeats`` runs after a warm-up run, as the machine may be shared.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

import harness

DEFAULT_THREADS = (1,)

if __name__ == "__main__":
    harness.set_thread_environment(max(harness.threads_from_argv(sys.argv[1:], DEFAULT_THREADS)))
    harness.use_this_checkout()

import torch  # noqa: E402  (after the thread settings: OpenMP reads them when torch loads)

VARIANTS = ("trainer sampler", "transformers generate")


def best_of(fn: Callable[[], int], repeats: int) -> tuple[float, int]:
    """(best seconds, tokens generated) over ``repeats`` runs of ``fn``, after one untimed
    warm-up run (first calls pay for lazy initialisation)."""
    fn()
    best, tokens = float("inf"), 0
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = fn()
        best = min(best, time.perf_counter() - start)
    return best, tokens


def sampler_run(policy: Any, runtime: Any, batch: int, new_tokens: int, kv_cache: bool
                ) -> Callable[[], int]:
    from lightning_adv.trainer.data import generator
    from lightning_adv.trainer.policies.base import GenerationRequest, SamplingParams
    from lightning_adv.trainer.policies.hf.sampling import hf_generate

    request = GenerationRequest(list(range(batch)), 1, new_tokens,
                                SamplingParams(kv_cache=kv_cache))

    def run() -> int:
        groups = hf_generate(policy, runtime, request, generator(0, "bench"))
        return sum(ep.generated.count(True) for g in groups for ep in g)
    return run


def generate_run(policy: Any, runtime: Any, batch: int, new_tokens: int, kv_cache: bool
                 ) -> Callable[[], int]:
    tokenizer = runtime.vocab
    prompts = [runtime.instance(i)[1] for i in range(batch)]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[tokenizer.pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    eos = sorted(tokenizer.eos_ids)

    def run() -> int:
        torch.manual_seed(0)
        out = policy.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=0,
                                    top_p=1.0, max_new_tokens=new_tokens, use_cache=kv_cache,
                                    pad_token_id=tokenizer.pad_id, eos_token_id=eos)
        new = out[:, width:]
        ended = torch.isin(new, torch.tensor(eos))
        # tokens up to and including each row's first EOS (generate pads after it)
        first = torch.where(ended.any(1), ended.float().argmax(1) + 1, new.shape[1])
        return int(first.sum())
    return run


def measure(model_dir: str, batch: int, new_tokens: Sequence[int], threads: Sequence[int],
            repeats: int) -> tuple[str, list[list[str]]]:
    """The model's description and one table row per variant, token count and threads."""
    from lightning_adv.trainer.policies.hf.policy import build_hf_policy, check_hf_policy
    from lightning_adv.trainer.policies.tiny_network import PolicyConfig
    from lightning_adv.trainer.tasks.runtime import TaskConfig, TaskRuntime

    config = PolicyConfig(pretrained=model_dir, value_head=False)
    setup = check_hf_policy(config)
    runtime = TaskRuntime(TaskConfig(name="reverse"), tokenizer=setup.tokenizer)
    policy = build_hf_policy(config, seed=0).eval()
    model = policy.model.config
    about = (f"{model.model_type}, {model.num_hidden_layers} layers, width {model.hidden_size}, "
             f"vocabulary {model.vocab_size}; batch {batch} (left-padded chat prompts); best "
             f"of {repeats} runs")
    makers = {"trainer sampler": sampler_run, "transformers generate": generate_run}
    rows = []
    for count in threads:
        torch.set_num_threads(count)
        for n in new_tokens:
            for name in VARIANTS:
                (cached, tokens), (plain, plain_tokens) = (
                    best_of(makers[name](policy, runtime, batch, n, kv), repeats)
                    for kv in (True, False))
                rows.append([name, str(n), str(count), f"{tokens / cached:.0f}",
                             f"{plain_tokens / plain:.0f}",
                             harness.format_ratio(plain / cached * tokens / max(plain_tokens, 1))])
    return about, rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python benchmarks/hf_sampling.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="causal LM directory (default: a fresh tiny model)")
    parser.add_argument("--batch", type=int, default=16, help="sequences sampled at once")
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--threads", type=int, nargs="+", default=list(DEFAULT_THREADS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--page", type=Path, help="also write the results as a markdown page")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if min(args.batch, args.repeats, *args.new_tokens) < 1:
        parser.error("--batch, --new-tokens and --repeats must be at least 1")
    with tempfile.TemporaryDirectory(prefix="hf_sampling_") as tmp:
        model_dir = args.model or str(harness.make_tiny_model(harness.ROOT,
                                                              Path(tmp) / "tiny_lm"))
        header = harness.page_header("Sampling from a Hugging Face policy: KV cache on and off", [
            f"Threads: {harness.thread_note(args.threads)}",
            f"Model: {args.model or 'the tiny model of make-tiny'}; lightning_adv from "
            f"{harness.check_package_home(harness.ROOT)}"])
        print(header, flush=True)
        about, rows = measure(model_dir, args.batch, args.new_tokens, args.threads, args.repeats)
    table = harness.table(["variant", "new tokens", "threads", "KV cache (tokens/s)",
                           "no cache (tokens/s)", "speed-up"], rows)
    harness.write_page(args.page, header, [
        f"{about}. Tokens/s: generated tokens (EOS included) over wall time; speed-up: the "
        f"time per token without the cache ÷ with it.\n\n{table}"])


if __name__ == "__main__":
    main()
