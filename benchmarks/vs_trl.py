"""This project's ``fit`` beside TRL's ``GRPOTrainer``: the same GRPO run, side by side.

Both train the tiny Hugging Face model of this checkout's ``make-tiny`` command (no
network) on the reverse-the-letters text task (``data/reverse_text.jsonl``, scored by
``char_match``), with the same settings: the same prompts in the same order (the order
this project's prompt sampler draws; TRL reads them unshuffled, and the first prompt's
tokens are checked to be the same in both), ``--samples`` responses per prompt,
``--prompts-per-step`` prompts per step, ``--max-new-tokens``, temperature 1 with no
top-k / top-p, AdamW at a constant ``--lr`` with no weight decay, gradients clipped at
norm 1, GRPO's constants (group-normalized rewards with std + 1e-4, clip ε 0.2, the k3
KL to the frozen initial policy with β ``--beta``, token-mean loss over each optimizer
step's tokens, one pass over each rollout in ``--minibatches`` optimizer steps), no LoRA,
no entropy bonus. Each run is a fresh process on one thread; for each seed the two run
one after the other, in alternating order.

Reported for each: training steps (rollouts) per second and generated tokens per second
(the training loop, model loading excluded), peak resident memory of the process, the
training reward of the last steps, and the task reward of the trained model on 200
held-out prompts (the last lines of the dataset, never trained on) by one evaluator
(``transformers``' ``generate``, greedy and sampled), mean over ``--seeds``::

    python benchmarks/vs_trl.py --steps 100 --seeds 0 1 2 3 4 5 6 7 --every-step-too \
        --page docs/benchmarks/vs-trl.md

``benchmarks/real_model.py`` runs the same comparison on a real pretrained model
(SmolLM2-135M-Instruct) through these functions, with other settings: the model, the
dataset and its held-out lines, the reward, LoRA, runs side by side (``--jobs``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import resource
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

import harness

DATASET = harness.ROOT / "data" / "reverse_text.jsonl"
HELD_OUT = 200
REWARD = "lightning_adv.trainer.tasks.text.char_match"
EVAL_SAMPLES = 4
FRAMEWORKS = ("lightning_adv", "trl")
EVERY_STEP = "lightning_adv_every_step"
"""this project's run again, logging every step (``--every-step-too``): what logging costs"""


# ---------------------------------------------------------------------------- shared


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def reward_text(reward: str, response: str, answer: str) -> float:
    """The task's reward (the function at dotted path ``reward``, as ``task.reward``
    names it) of a response."""
    from types import SimpleNamespace

    module, name = reward.rsplit(".", 1)
    fn = getattr(importlib.import_module(module), name)
    return fn(SimpleNamespace(response=response, instance={"answer": answer}))


def char_match_text(response: str, answer: str) -> float:
    """The reverse task's reward (``lightning_adv.trainer.tasks.text.char_match``)."""
    return reward_text(REWARD, response, answer)


def render_prompt(tokenizer: Any, prompt: Any) -> str:
    """A dataset prompt as the text the policy reads, as this project's tokenizer renders
    it: a string is one user message (with the generation prompt); a list of messages
    ending with an assistant message is a response prefix the model continues
    (``continue_final_message``)."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    prefix = messages[-1].get("role") == "assistant"
    return tokenizer.apply_chat_template(list(messages), tokenize=False,
                                         add_generation_prompt=not prefix,
                                         continue_final_message=prefix)


def training_order(records: int, seed: int) -> list[int]:
    """The order in which this project's prompt sampler visits ``records`` prompts in the
    first epoch of a one-rank run with ``seed``."""
    from lightning_adv.trainer.data import PromptDataset, PromptSampler

    return list(PromptSampler(PromptDataset(records), 1, seed=seed))


# ---------------------------------------------------------------------------- the children


def run_ours(settings: dict[str, Any], out: Path) -> dict[str, Any]:
    import lightning.pytorch as pl

    from lightning_adv.trainer import PPOModule

    s = settings
    policy = {"pretrained": s["model"], "dtype": "float32", "value_head": False}
    if s.get("lora"):
        policy["lora"] = s["lora"]
    module = PPOModule(
        policy=policy,
        task={"dataset": s["train"], "reward": s.get("reward", REWARD),
              "chat_template": "auto"},
        ppo={"prompts_per_step": s["prompts_per_step"], "n_samples": s["samples"],
             "epochs": 1, "minibatches": s["minibatches"], "lr": s["lr"],
             "weight_decay": 0.0, "max_grad_norm": 1.0, "temperature": 1.0,
             "max_new_tokens": s["max_new_tokens"], "entropy_coef": 0.0, "clip_eps": 0.2,
             "kl_loss_coef": s["beta"], "kl_loss_estimator": "k3",
             "loss_agg_mode": "token-mean"},
        actor={"kl_ctl": 0.0, "discount": 1.0, "gae_lambda": 1.0,
               "reward_norm": {"mean_level": "group", "std_level": "group", "eps": 1e-4},
               "advantage": {"estimator": {"implementation": "token_gae", "kwargs": {}}}},
        evaluation={"num_prompts": 0}, seed=s["seed"])
    counts = {"tokens": 0}
    rollout = module.rollout

    def counting_rollout(*args: Any, **kwargs: Any) -> Any:
        groups = rollout(*args, **kwargs)
        counts["tokens"] += sum(sum(ep.generated) for group in groups for ep in group)
        return groups

    module.rollout = counting_rollout
    update, generation = time_update(module), time_generation(module)
    first = module.runtime.instance(training_order(len(module.runtime.task.records),
                                                   s["seed"])[0])[1]
    timer = LoopTimer(pl.Callback)
    pl.seed_everything(s["seed"], verbose=False)
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=s["steps"], logger=False,
                         log_every_n_steps=s["log_every"], enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu", devices=1,
                         callbacks=[timer], default_root_dir=str(out))
    trainer.fit(module)
    model = module.policy.model
    update["parameters"] = sum(p.numel() for p in model.parameters())
    update["trainable_parameters"] = sum(p.numel() for p in model.parameters()
                                         if p.requires_grad)
    if s.get("matmul"):  # the reference matmul, in this process and thread
        update["matmul_flops"] = matmul_flops(update["micro_positions"],
                                              model.config.hidden_size)
        generation["decode_step_seconds"] = decode_step_seconds(
            model, generation["rows"], len(first), s["max_new_tokens"])
    return {"steps": module.rollout_step, "seconds": timer.seconds, "tokens": counts["tokens"],
            "rewards": list(module.reward_history), "model": str(out / "hf_model"),
            "first_prompt": list(first), "update": update, "generation": generation}


def time_update(module: Any) -> dict[str, Any]:
    """Time the update phase (``module.updater.step``: the PPO epochs' forward, backward
    and optimizer steps) and count its tokens: ``seconds``, ``tokens`` (the sequences'
    tokens, prompts included, times the epochs: each is trained on once per epoch),
    ``computed_tokens`` (the same with each distinct prompt of a rollout counted once: what
    the forward reads when a policy reads shared prompts once, exact with one minibatch) and
    ``micro_positions`` (the largest micro-batch's rows x longest row, padding included)."""
    update = {"seconds": 0.0, "tokens": 0, "computed_tokens": 0, "micro_positions": 0}
    step, ppo = module.updater.step, module.ppo_config

    def timed_step(batch: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return step(batch, *args, **kwargs)
        finally:
            update["seconds"] += time.perf_counter() - start
            mask = batch["attention_mask"]
            update["tokens"] += int(mask.sum()) * ppo.epochs
            update["computed_tokens"] += computed_tokens(batch) * ppo.epochs
            rows = -(-mask.shape[0] // ppo.minibatches)
            if ppo.micro_batch_size is not None:
                rows = min(rows, ppo.micro_batch_size)
            width = int(mask.sum(1).max()) if mask.numel() else 0
            update["micro_positions"] = max(update["micro_positions"], rows * width)

    module.updater.step = timed_step
    return update


def computed_tokens(batch: dict[str, Any]) -> int:
    """The batch's tokens with each distinct prompt (the tokens before a row's first
    generated one) counted once."""
    lengths = batch["attention_mask"].sum(1).tolist()
    prompts = (batch["loss_mask"] > 0).int().argmax(1).tolist()
    distinct = {tuple(ids[:p]): p for ids, p in zip(batch["input_ids"].tolist(), prompts)}
    return sum(n - p for n, p in zip(lengths, prompts)) + sum(distinct.values())


def matmul_flops(rows: int, width: int, min_seconds: float = 1.0) -> float:
    """Achieved FLOP/s of a float32 ``[rows, width] @ [width, width]`` matmul on this
    process's threads (2 x rows x width^2 per product; repeated for ``min_seconds``)."""
    import torch

    a, b = torch.randn(max(rows, 1), width), torch.randn(width, width)
    a @ b  # warm-up
    done, start = 0, time.perf_counter()
    while True:
        a @ b
        done += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return 2 * max(rows, 1) * width * width * done / elapsed


def time_generation(module: Any) -> dict[str, Any]:
    """Time the policy's ``generate`` (sampling alone: the prompts' forward and every new
    token's, without scoring or the update) inside the training loop: ``seconds``,
    ``calls`` and ``rows`` (the largest batch of sampled rows)."""
    timed = {"seconds": 0.0, "calls": 0, "rows": 0}
    generate = module.policy.generate

    def timed_generate(runtime: Any, request: Any, gen: Any) -> Any:
        start = time.perf_counter()
        groups = generate(runtime, request, gen)
        timed["seconds"] += time.perf_counter() - start
        timed["calls"] += 1
        timed["rows"] = max(timed["rows"], sum(len(group) for group in groups))
        return groups

    module.policy.generate = timed_generate
    return timed


def decode_step_seconds(model: Any, rows: int, context: int, new_tokens: int,
                        min_seconds: float = 2.0) -> float:
    """Seconds of one forward of one new token for each of ``rows`` sequences, with a KV
    cache of ``context`` to ``context + new_tokens`` tokens (what each step of batched
    generation computes; no sampling): the prompts' forward, then ``new_tokens`` one-token
    forwards, timed alone, repeated for ``min_seconds``; the mean over the one-token steps."""
    import torch

    vocab, was_training = model.config.vocab_size, model.training
    model.eval()
    generator = torch.Generator().manual_seed(0)
    steps, seconds = 0, 0.0
    with torch.no_grad():
        while seconds < min_seconds or steps <= new_tokens:  # (the first round warms up)
            out = model(torch.randint(vocab, (rows, context), generator=generator),
                        use_cache=True, logits_to_keep=1)
            cache, round_seconds = out.cache, 0.0
            for _ in range(new_tokens):
                token = torch.randint(vocab, (rows, 1), generator=generator)
                start = time.perf_counter()
                cache = model(token, cache=cache, use_cache=True, logits_to_keep=1).cache
                round_seconds += time.perf_counter() - start
            if steps:
                seconds += round_seconds
            steps += new_tokens
    model.train(was_training)
    return seconds / (steps - new_tokens)


def LoopTimer(base: type) -> Any:  # noqa: N802 -- builds a callback class of either trainer
    """A callback timing the training loop (from its start to its end) for a Lightning
    ``Callback`` or a transformers ``TrainerCallback`` ``base``."""

    class Timer(base):
        seconds = 0.0
        _start = 0.0

        def on_train_start(self, *args: Any, **kwargs: Any) -> None:
            self._start = time.perf_counter()

        def on_train_end(self, *args: Any, **kwargs: Any) -> None:
            self.seconds = time.perf_counter() - self._start

        on_train_begin = on_train_start  # (transformers' name)

    return Timer()


def run_trl(settings: dict[str, Any], out: Path) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lightning_adv.trainer.tasks.text import load_prompt_records

    s = settings
    path = s.get("trl_model", s["model"])  # (a plain model directory: TRL has no GGUF loading)
    reward = s.get("reward", REWARD)
    records = load_prompt_records(s["train"])
    ordered = [records[i] for i in training_order(len(records), s["seed"])]
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    if isinstance(ordered[0]["prompt"], str):  # one user message: TRL's conversational form
        dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}],
                                      "answer": r["answer"]} for r in ordered])
        first = tokenizer.apply_chat_template(dataset[0]["prompt"], add_generation_prompt=True,
                                              tokenize=True)
        first = first["input_ids"] if isinstance(first, dict) or hasattr(first, "keys") else first
    else:  # messages ending with a response prefix: the rendered text, which TRL tokenizes
        dataset = Dataset.from_list([{"prompt": render_prompt(tokenizer, r["prompt"]),
                                      "answer": r["answer"]} for r in ordered])
        first = tokenizer(text=[dataset[0]["prompt"]])["input_ids"][0]  # as TRL does
    per_step = s["prompts_per_step"] * s["samples"]
    steps: list[list[float]] = []
    counts = {"tokens": 0}

    def text_of(completion: Any) -> str:  # (conversational: [{"role", "content"}])
        return completion if isinstance(completion, str) else completion[0]["content"]

    def task_reward(completions: list, answer: list, completion_ids: list,
                    **_: Any) -> list[float]:
        rewards = [reward_text(reward, text_of(c), a) for c, a in zip(completions, answer)]
        counts["tokens"] += sum(len(ids) for ids in completion_ids)
        steps.append(rewards)
        return rewards

    config = GRPOConfig(
        output_dir=str(out), use_cpu=True, seed=s["seed"], bf16=False, fp16=False,
        per_device_train_batch_size=per_step // s["minibatches"], gradient_accumulation_steps=1,
        steps_per_generation=s["minibatches"], num_iterations=1, num_generations=s["samples"],
        max_completion_length=s["max_new_tokens"], temperature=1.0, top_k=0, top_p=1.0,
        learning_rate=s["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=1.0, beta=s["beta"], epsilon=0.2, loss_type="dapo",
        scale_rewards="group", entropy_coef=0.0, max_steps=s["steps"] * s["minibatches"],
        shuffle_dataset=False, logging_steps=s["log_every"] * s["minibatches"],
        save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0,
        log_completions=False)
    model = AutoModelForCausalLM.from_pretrained(path, dtype="float32")
    timer = LoopTimer(TrainerCallback)
    trainer = GRPOTrainer(model=model, reward_funcs=task_reward, args=config,
                          train_dataset=dataset, processing_class=tokenizer, callbacks=[timer])
    trainer.train()
    trainer.model.save_pretrained(out / "hf_model")
    tokenizer.save_pretrained(out / "hf_model")
    rollouts = len(steps)
    return {"steps": rollouts, "seconds": timer.seconds, "tokens": counts["tokens"],
            "rewards": [sum(r) / len(r) for r in steps], "model": str(out / "hf_model"),
            "first_prompt": list(first), "completions_per_step": per_step}


def evaluate(models: dict[str, str], held_out: Path, seed: int, max_new_tokens: int,
             reward: str = REWARD, sampled: bool = True, batch_size: Optional[int] = None
             ) -> dict[str, dict[str, float]]:
    """Greedy (and with ``sampled``, sampled) task reward of each model on the held-out
    prompts, by ``transformers``' ``generate`` (the same evaluator for every model), the
    prompts rendered as the trainers read them (:func:`render_prompt`), ``batch_size`` at a
    time (None: all at once)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_adv.trainer.tasks.text import load_prompt_records

    records = load_prompt_records(held_out)
    size = batch_size or len(records)
    modes = [("greedy", {"do_sample": False})]
    if sampled:
        modes.append(("sampled", {"do_sample": True, "temperature": 1.0, "top_k": 0,
                                  "top_p": 1.0, "num_return_sequences": EVAL_SAMPLES}))
    out = {}
    for name, path in models.items():
        tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(path, dtype="float32").eval()
        prompts = [render_prompt(tokenizer, r["prompt"]) for r in records]
        scores = {}
        for mode, kwargs in modes:
            torch.manual_seed(seed)
            texts = []
            for start in range(0, len(prompts), size):
                batch = tokenizer(prompts[start:start + size], return_tensors="pt",
                                  padding=True, add_special_tokens=False)
                with torch.no_grad():
                    ids = model.generate(**batch, max_new_tokens=max_new_tokens,
                                         pad_token_id=tokenizer.pad_token_id, **kwargs)
                texts += tokenizer.batch_decode(ids[:, batch["input_ids"].shape[1]:],
                                                skip_special_tokens=True)
            per_row = len(texts) // len(records)
            rewards = [reward_text(reward, t, records[i // per_row]["answer"])
                       for i, t in enumerate(texts)]
            scores[mode] = sum(rewards) / len(rewards)
            if mode == "greedy":  # (one string for every prompt: the reward is that string's)
                scores["greedy_distinct"] = len(set(texts))
        out[name] = scores
    return out


def child(args: argparse.Namespace) -> None:
    harness.set_thread_environment(1)
    import torch

    torch.set_num_threads(1)
    settings = json.loads(args.child_settings)
    harness.check_package_home(Path.cwd())
    warnings.simplefilter("ignore")
    out = Path(settings["out"])
    if args.child == "evaluate":
        result = evaluate(settings["models"], Path(settings["held_out"]), settings["seed"],
                          settings["max_new_tokens"], settings.get("reward", REWARD),
                          settings.get("sampled", True), settings.get("batch_size"))
    else:
        result = (run_ours if args.child == "lightning_adv" else run_trl)(settings, out)
        result["peak_rss_mib"] = peak_rss_mib()
    harness.report_result(result)


# ---------------------------------------------------------------------------- parent side


def split_dataset(tmp: Path, dataset: Path = DATASET, held: int = HELD_OUT,
                  reserved: Optional[int] = None) -> tuple[Path, Path, int]:
    """The training prompts (all but the last ``reserved`` lines, by default ``held``),
    the held-out ones (the last ``held`` lines), and the trainer's default tokens per
    response for them (the longest answer + 1)."""
    lines = [line for line in dataset.read_text().splitlines() if line.strip()]
    train, held_out = tmp / "train.jsonl", tmp / "held_out.jsonl"
    train.write_text("\n".join(lines[:-(reserved or held)]) + "\n")
    held_out.write_text("\n".join(lines[-held:]) + "\n")
    longest = max(len(json.loads(line)["answer"]) for line in lines)
    return train, held_out, longest + 1


def run_side(kind: str, settings: dict[str, Any]) -> dict[str, Any]:
    """One child process (one thread) of ``kind``: a trainer's run, or ``evaluate``."""
    command = [str(Path(__file__).resolve()), "--child", kind, "--child-settings",
               json.dumps(settings)]
    what = "the evaluation" if kind == "evaluate" else f"the {kind} run"
    start = time.perf_counter()
    result = harness.run_child(command, harness.ROOT, 1, what)
    if kind != "evaluate":  # the process's wall time: loading, training, saving
        result["wall_seconds"] = time.perf_counter() - start
    return result


def run_all(jobs: int, calls: Sequence[Callable[[], Any]],
            done: Optional[Callable[[int, Any], None]] = None) -> list[Any]:
    """Run ``calls`` (each starting child processes) ``jobs`` at a time, in their order
    (1: one after the other), calling ``done(i, result)`` as each ends; the results in
    order. Independent runs side by side on a loaded machine: the calls that run at once
    share it alike (list the two trainers of a seed next to each other)."""
    if jobs <= 1:
        results = []
        for i, call in enumerate(calls):
            results.append(call())
            if done is not None:
                done(i, results[-1])
        return results

    def run(i: int) -> Any:
        result = calls[i]()
        if done is not None:
            done(i, result)
        return result

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(run, range(len(calls))))


def mean_sd(values: Sequence[float], digits: int = 2) -> str:
    mean = statistics.mean(values)
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.{digits}f} ± {spread:.{digits}f}"


def results_table(runs: dict[str, list[dict[str, Any]]], tail: int) -> str:
    names = {"lightning_adv": "lightning_adv fit", "trl": "TRL GRPOTrainer",
             EVERY_STEP: "lightning_adv fit, logging every step"}
    rows = []
    for kind in (kind for kind in names if runs.get(kind)):
        r = runs[kind]
        rows.append([names[kind],
                     mean_sd([x["steps"] / x["seconds"] for x in r]),
                     mean_sd([x["tokens"] / x["seconds"] for x in r], 0),
                     mean_sd([x["tokens"] / x["steps"] for x in r], 0),
                     mean_sd([x["peak_rss_mib"] for x in r], 0),
                     mean_sd([statistics.mean(x["rewards"][-tail:]) for x in r], 3),
                     mean_sd([x["eval"]["greedy"] for x in r], 3),
                     mean_sd([x["eval"]["greedy_distinct"] for x in r], 1),
                     mean_sd([x["eval"]["sampled"] for x in r], 3)])
    return harness.table(["trainer", "steps/s", "generated tokens/s", "tokens per step",
                          "peak RSS (MiB)", f"train reward, last {tail} steps",
                          "held-out reward, greedy", f"distinct greedy responses (of {HELD_OUT})",
                          "held-out reward, sampled"], rows)


def ratio_table(runs: dict[str, list[dict[str, Any]]], seeds: Sequence[int]) -> str:
    rows = []
    for i, seed in enumerate(seeds):
        ours, trl = runs["lightning_adv"][i], runs["trl"][i]
        rows.append([str(seed), f"{ours['tokens'] / ours['seconds']:.0f}",
                     f"{trl['tokens'] / trl['seconds']:.0f}",
                     harness.format_ratio(tokens_ratio(ours, trl)),
                     harness.format_ratio((ours["steps"] / ours["seconds"])
                                          / (trl["steps"] / trl["seconds"])),
                     f"{ours['eval']['greedy']:.3f} / {trl['eval']['greedy']:.3f}"])
    return harness.table(["seed", "lightning_adv tokens/s", "TRL tokens/s",
                          "tokens/s ratio", "steps/s ratio",
                          "held-out greedy reward (ours / TRL)"], rows)


def tokens_ratio(ours: dict[str, Any], trl: dict[str, Any]) -> float:
    return (ours["tokens"] / ours["seconds"]) / (trl["tokens"] / trl["seconds"])


def paired_table(runs: dict[str, list[dict[str, Any]]], tail: int) -> str:
    """This project minus TRL, seed by seed: the mean over seeds and its standard error
    (the spread of the paired differences / sqrt(seeds)), for the speed ratio and each
    reward."""
    pairs = list(zip(runs["lightning_adv"], runs["trl"]))

    def mean_se(values: list[float], digits: int) -> str:
        se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
        return f"{statistics.mean(values):+.{digits}f} ± {se:.{digits}f}"

    def ratio_row(label: str, ratios: list[float]) -> list[str]:
        se = statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else 0.0
        return [label, f"{statistics.mean(ratios):.2f} ± {se:.2f}",
                f"{min(ratios):.2f}–{max(ratios):.2f}"]

    rows = [ratio_row("tokens/s ratio (ours ÷ TRL)",
                      [tokens_ratio(ours, trl) for ours, trl in pairs])]
    if runs.get(EVERY_STEP):
        rows.append(ratio_row("tokens/s ratio, ours logging every step ÷ TRL",
                              [tokens_ratio(ours, trl) for ours, trl
                               in zip(runs[EVERY_STEP], runs["trl"])]))
    for label, value in ((f"train reward, last {tail} steps",
                          lambda x: statistics.mean(x["rewards"][-tail:])),
                         ("held-out reward, greedy", lambda x: x["eval"]["greedy"]),
                         ("held-out reward, sampled", lambda x: x["eval"]["sampled"])):
        diffs = [value(ours) - value(trl) for ours, trl in pairs]
        rows.append([f"{label} (ours − TRL)", mean_se(diffs, 3),
                     f"{min(diffs):+.3f}–{max(diffs):+.3f}"])
    return harness.table(["paired over the seeds", "mean ± standard error", "range"], rows)


def train_runs(kinds: dict[str, tuple[str, dict[str, Any]]], base: dict[str, Any],
               seeds: Sequence[int], tmp: Path, jobs: int) -> dict[str, list[dict[str, Any]]]:
    """Every run: for each seed, each of ``kinds`` (name -> the child's kind and its
    settings over ``base``), in a fresh one-thread process, ``jobs`` at a time; a seed's
    runs are listed together (alternating their order from seed to seed), so with
    ``--jobs`` equal to their number they run side by side. Each seed's trainers are
    checked to read the same first prompt. Returns name -> the runs, in ``seeds`` order."""
    names = list(kinds)
    order = [(seed, name) for i, seed in enumerate(seeds)
             for name in names[::1 if i % 2 == 0 else -1]]

    def call(seed: int, name: str) -> Callable[[], Any]:
        child_kind, extra = kinds[name]
        settings = {**base, **extra, "seed": seed, "out": str(tmp / f"{name}_{seed}")}
        return lambda: run_side(child_kind, settings)

    def done(i: int, result: dict[str, Any]) -> None:
        seed, name = order[i]
        print(f"seed {seed} {name}: {result['steps'] / result['seconds']:.2f} steps/s, "
              f"{result['tokens'] / result['seconds']:.0f} tokens/s", flush=True)

    results = run_all(jobs, [call(seed, name) for seed, name in order], done)
    runs = {name: [results[order.index((seed, name))] for seed in seeds] for name in names}
    for i, seed in enumerate(seeds):
        prompts = {name: runs[name][i]["first_prompt"] for name in names}
        if len({json.dumps(p) for p in prompts.values()}) > 1:
            raise SystemExit(f"seed {seed}: the trainers read different first prompts: "
                             f"{prompts}")
    return runs


def evaluate_runs(runs: dict[str, list[dict[str, Any]]], names: Sequence[str],
                  seeds: Sequence[int], settings: dict[str, Any], jobs: int,
                  initial: Optional[str] = None) -> Optional[dict[str, float]]:
    """Score the trained models of ``names`` on the held-out prompts (one evaluator
    process per seed, ``jobs`` at a time), into each run's ``eval``; with ``initial`` (the
    untrained model's directory) also that model, whose scores are returned."""
    def call(models: dict[str, str], seed: int) -> Callable[[], Any]:
        return lambda: run_side("evaluate", {**settings, "models": models, "seed": seed})

    calls = [call({name: runs[name][i]["model"] for name in names}, seed)
             for i, seed in enumerate(seeds)]
    if initial is not None:
        calls.append(call({"initial": initial}, seeds[0]))
    scores = run_all(jobs, calls)
    for i in range(len(seeds)):
        for name in names:
            runs[name][i]["eval"] = scores[i][name]
    return scores[-1]["initial"] if initial is not None else None


def compare(args: argparse.Namespace, tmp: Path) -> None:
    import importlib.metadata

    model = harness.make_tiny_model(harness.ROOT, tmp / "tiny_lm")
    train, held_out, default_tokens = split_dataset(tmp)
    max_new_tokens = args.max_new_tokens or default_tokens
    base = {"model": str(model), "train": str(train), "steps": args.steps,
            "prompts_per_step": args.prompts_per_step, "samples": args.samples,
            "minibatches": args.minibatches, "lr": args.lr, "beta": args.beta,
            "max_new_tokens": max_new_tokens, "log_every": args.log_every}
    trl_version = importlib.metadata.version("trl")
    header = harness.page_header("Side by side with TRL's GRPOTrainer", [
        f"Threads: {harness.thread_note([1])}; each run a fresh process, "
        + (f"{args.jobs} at a time (a seed's runs side by side)" if args.jobs > 1 else
           "the two trainers one after the other for each seed (alternating which goes "
           "first)"),
        f"TRL {trl_version} (GRPOTrainer), against this checkout's `lightning_adv`",
        f"Model: the tiny model of `python -m lightning_adv make-tiny` (Qwen2, 2 layers, "
        f"width 64, float32); task: {DATASET.relative_to(harness.ROOT)} minus its last "
        f"{HELD_OUT} lines (held out), reward `char_match`",
        f"{args.steps} training steps of {args.prompts_per_step} prompts x {args.samples} "
        f"samples, at most {max_new_tokens} new tokens per response, {args.minibatches} "
        f"optimizer step(s) per rollout, lr {args.lr} (constant), β {args.beta} (k3), "
        f"clip ε 0.2, seeds {' '.join(map(str, args.seeds))}; both log their metrics every "
        f"{args.log_every} training steps (Lightning's `log_every_n_steps`, TRL's "
        f"`logging_steps`, whose default is 10)"])
    print(header, flush=True)
    kinds = {kind: ("lightning_adv", {}) for kind in FRAMEWORKS if kind != "trl"}
    kinds["trl"] = ("trl", {})
    if args.every_step_too:
        kinds[EVERY_STEP] = ("lightning_adv", {"log_every": 1})
    runs = train_runs(kinds, base, args.seeds, tmp, args.jobs)
    evaluated = [kind for kind in kinds if kind != EVERY_STEP]
    eval_settings = {"held_out": str(held_out), "max_new_tokens": max_new_tokens,
                     "out": str(tmp)}
    initial = evaluate_runs(runs, evaluated, args.seeds, eval_settings, args.jobs,
                            initial=str(model))
    if args.every_step_too:  # the same training (logging reads, never draws): same model
        for i, seed in enumerate(args.seeds):
            if runs[EVERY_STEP][i]["rewards"] != runs["lightning_adv"][i]["rewards"]:
                raise SystemExit(f"seed {seed}: logging every step changed the training rewards")
            runs[EVERY_STEP][i]["eval"] = runs["lightning_adv"][i]["eval"]
    tail = min(10, args.steps)
    sections = [
        "Means ± standard deviations over the seeds. Steps/s and tokens/s time the training "
        "loop (from its start to its end: sampling, scoring, the update, logging; model "
        "loading excluded); tokens count every generated token (EOS included). Peak RSS is "
        "the whole process's. The held-out rewards score the trained model's responses to "
        f"the {HELD_OUT} held-out prompts with one evaluator (`transformers` `generate`: "
        f"greedy, and {EVAL_SAMPLES} samples at temperature 1); the initial model scores "
        f"{initial['greedy']:.3f} greedy, {initial['sampled']:.3f} sampled. Where a trained "
        f"model's greedy responses are one string for every prompt (distinct greedy "
        f"responses 1), its greedy reward is that string's match with the answers, a draw "
        f"between strings rather than a measure of learning; the sampled reward "
        f"({HELD_OUT} prompts x {EVAL_SAMPLES}) and the training reward are the steadier "
        f"comparisons.\n",
        results_table(runs, tail),
        "Per seed: this project ÷ TRL (above 1: this project is faster).\n",
        ratio_table(runs, args.seeds),
        "Seed by seed, this project against TRL (the same seed's prompts; a reward "
        "difference within about two standard errors of 0 is not told apart from seed "
        "noise by these seeds).\n",
        paired_table(runs, tail)]
    harness.write_page(args.page, header, sections,
                       deterministic="The rewards are deterministic for a seed on one "
                                     "machine and library version; the timings are not.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python benchmarks/vs_trl.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="training steps (rollouts)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8, help="responses per prompt")
    parser.add_argument("--minibatches", type=int, default=1,
                        help="optimizer steps per rollout (TRL's steps_per_generation)")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="tokens per response (default: the longest answer + 1)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--beta", type=float, default=0.04, help="the KL loss coefficient")
    parser.add_argument("--log-every", type=int, default=10,
                        help="training steps between metric logs, in both trainers")
    parser.add_argument("--every-step-too", action="store_true",
                        help="also run this project logging every step (what logging costs)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs at a time, each its own one-thread process (2: the two "
                             "trainers of a seed side by side; default: one after the other)")
    parser.add_argument("--page", type=Path, help="also write the results as a markdown page")
    parser.add_argument("--child", choices=[*FRAMEWORKS, "evaluate"], help=argparse.SUPPRESS)
    parser.add_argument("--child-settings", help=argparse.SUPPRESS)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.child is not None:
        child(args)
        return
    if min(args.steps, args.prompts_per_step, args.samples, args.minibatches, args.log_every) < 1:
        parser.error("--steps, --prompts-per-step, --samples, --minibatches and --log-every "
                     "must be at least 1")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.samples < 2:
        parser.error("--samples: GRPO needs at least 2 responses per prompt")
    if (args.prompts_per_step * args.samples) % args.minibatches:
        parser.error("--minibatches must divide --prompts-per-step x --samples")
    missing = [name for name in ("trl", "datasets") if importlib.util.find_spec(name) is None]
    if missing:  # before anything runs
        parser.error(f"TRL's GRPOTrainer needs {' and '.join(missing)}, not installed: "
                     f"pip install -c constraints.txt trl datasets")
    harness.set_thread_environment(1)
    with tempfile.TemporaryDirectory(prefix="vs_trl_") as tmp:
        compare(args, Path(tmp))


if __name__ == "__main__":
    main(sys.argv[1:])
