"""Side-by-side benchmark of the advantage kernels: ``python -m lightning_adv.bench``.

For each batch size (B rows x T columns) and device, one run times, interleaved round by
round so that a busy machine slows every entry alike:

* ``clone``: ``clone()`` of the kernel's input tensors, the memory-bandwidth floor;
* the reference loops of :mod:`lightning_adv.loops` (token positions, turn slots,
  and the per-row pure-Python turn loop);
* the fast kernels ``compute_token_gae`` (γλ = 1, γλ = 0.95 and a per-row λ tensor) and
  ``compute_turn_gae``;
* the whole ``AdvantageModule`` with the default ``ActorConfig()`` and with a GRPO
  config (no KL, group-normalized rewards), on the rollout batch the kernel inputs come
  from.

The batch is built with :func:`lightning_adv.concat_batch` from prompts of 8 rows each: a
prompt prefix, one to four generated turns separated by tool-output gaps, right padding,
and one row in four running to the full width (truncated, so it bootstraps). Kernel
inputs are that batch moved to the next-token convention, as the module does.

Each entry is the median of its repeats; slow reference loops get fewer repeats at big
sizes (the table says how many). Speed is reported here, never asserted in a test.
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import pstats
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from lightning_adv import (
    ActorConfig, AdvantageModule, GAELambdaContext, NormConfig, compute_token_gae,
    compute_turn_gae, concat_batch, vapo_length_adaptive_gae)
from lightning_adv.loops import token_gae_loop, turn_gae_loop, turn_gae_per_row

DEFAULT_SIZES = ((8, 512), (64, 2048), (256, 4096), (16, 16384))
ROWS_PER_PROMPT = 8
#: Time budget (seconds) for the repeats of one slow reference loop at one size.
SLOW_BUDGET_S = 3.0

TARGETS = {
    "token_vs_loop": 20.0,   # token GAE at least 20x the loop (at B=64, T=2048)
    "token_vs_clone": 8.0,   # ... and within 8x of the clone
    "turn_vs_row_loop": 5.0,  # turn GAE at least 5x the per-row loop
    "module_vs_kernel": 2.0,  # the whole module at most 2x the bare kernel
}


# ---------------------------------------------------------------------------- inputs


def _prompt_rows(rows: int, width: int, gen: torch.Generator) -> dict[str, Tensor]:
    """One prompt's rows: prompt | turn (| tool output | turn)* | padding."""
    prompt = int(torch.randint(max(1, width // 16), max(2, width // 8 + 1), (), generator=gen))
    attention = torch.zeros(rows, width, dtype=torch.long)
    loss_mask = torch.zeros(rows, width, dtype=torch.long)
    turn_ids = torch.full((rows, width), -1, dtype=torch.long)
    room = width - prompt
    for i in range(rows):
        truncated = bool(torch.rand((), generator=gen) < 0.25)
        length = room if truncated else int(torch.randint(max(1, room // 8), room + 1, (),
                                                            generator=gen))
        turns = int(torch.randint(1, 5, (), generator=gen))
        gap = max(1, length // 20)
        # Turn boundaries: equal shares of the generated span, a tool-output gap after each
        # turn but the last.
        edges = torch.linspace(0, length, turns + 1).long().tolist()
        attention[i, :prompt + length] = 1
        for u in range(turns):
            start, stop = prompt + edges[u], prompt + edges[u + 1] - (gap if u < turns - 1 else 0)
            if stop > start:
                loss_mask[i, start:stop] = 1
                turn_ids[i, start:stop] = u
    logprobs = -torch.rand(rows, width, generator=gen) * loss_mask
    return {
        "input_ids": torch.randint(1, 32000, (rows, width), generator=gen) * attention,
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "logprobs": logprobs,
        # log-probs are <= 0 (the module warns about a ref_logp above 0 where it is read)
        "ref_logp": (logprobs + 0.05 * torch.randn(rows, width, generator=gen)).clamp(max=0)
        * attention,
        "values": torch.randn(rows, width, generator=gen) * attention,
        "turn_ids": turn_ids,
        "rewards": (torch.rand(rows, generator=gen) < 0.5).float(),
    }


@dataclass
class Inputs:
    batch: dict
    meta: object
    rewards: Tensor
    values: Tensor
    loss_mask: Tensor
    turn_ids: Tensor
    bootstrap: Tensor
    row_lambda: Tensor


def realistic_inputs(bs: int, width: int, device: torch.device, seed: int = 0) -> Inputs:
    """A rollout batch from :func:`concat_batch` and the aligned kernel inputs derived from it."""
    gen = torch.Generator().manual_seed(seed)
    prompts = []
    left = bs
    while left:
        rows = min(ROWS_PER_PROMPT, left)
        prompts.append(_prompt_rows(rows, width, gen))
        left -= rows
    batch, meta = concat_batch(prompts)
    batch = {k: v.to(device) for k, v in batch.items()}
    # Next-token alignment as the module does it (SPEC §1): shift left, last turn id -1.
    mask = torch.roll(batch["loss_mask"], -1, dims=1).float()
    turn_ids = torch.roll(batch["turn_ids"], -1, dims=1)
    turn_ids[:, -1] = -1
    rows = torch.arange(bs, device=device)
    seqlens = batch["attention_mask"].sum(dim=1)
    values = batch["values"]
    bootstrap = values[rows, seqlens - 1] * (seqlens == width)
    # Per-step rewards: a small KL-like term on generated tokens plus the outcome reward at
    # the position predicting each row's last token.
    rewards = 0.01 * torch.randn(bs, width, generator=gen).to(device) * mask
    rewards[rows, (seqlens - 2).clamp(min=0)] += batch["rewards"]
    lengths = mask.sum(dim=1).long()
    context = GAELambdaContext(lengths, torch.zeros_like(lengths), lengths)
    row_lambda = vapo_length_adaptive_gae(context, alpha=0.05)
    return Inputs(batch, meta, rewards, values, mask, turn_ids, bootstrap, row_lambda)


# ---------------------------------------------------------------------------- timing


@dataclass
class Case:
    name: str
    fn: Callable[[], object]
    slow: bool = False
    times: list[float] = field(default_factory=list)
    repeats: int = 0

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def _time_once(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def run_cases(cases: Sequence[Case], repeats: int, device: torch.device) -> None:
    """Warm up the fast cases, time one run of each slow case to set its repeats, then
    time round by round, every case once per round (slow ones until their repeats end)."""
    for case in cases:
        if case.slow:
            case.times.append(_time_once(case.fn, device))
            case.repeats = max(1, min(repeats, int(SLOW_BUDGET_S / case.times[0])))
        else:
            for _ in range(2):
                _time_once(case.fn, device)
            case.repeats = repeats
    for round_ in range(repeats):
        for case in cases:
            if len(case.times) < case.repeats:
                case.times.append(_time_once(case.fn, device))


def bench_size(bs: int, width: int, device: torch.device, repeats: int) -> dict[str, Case]:
    x = realistic_inputs(bs, width, device)
    token_args = (x.rewards, x.values, x.loss_mask)
    turn_args = (x.rewards, x.values, x.loss_mask, x.turn_ids)

    def token(fn, lam, discount=1.0):
        return lambda: fn(*token_args, bootstrap_values=x.bootstrap, discount=discount,
                          gae_lambda=lam)

    def turn(fn, lam):
        return lambda: fn(*turn_args, bootstrap_values=x.bootstrap, discount=1.0, gae_lambda=lam)

    default = AdvantageModule(ActorConfig())
    grpo = AdvantageModule(ActorConfig(
        kl_ctl=0.0, reward_norm=NormConfig(mean_level="group", std_level="group")))
    cases = [
        Case("clone_token", lambda: [t.clone() for t in (*token_args, x.bootstrap)]),
        Case("clone_turn", lambda: [t.clone() for t in (*turn_args, x.bootstrap)]),
        Case("token_fast_1", token(compute_token_gae, 1.0)),
        Case("token_fast_095", token(compute_token_gae, 0.95)),
        Case("token_fast_row", token(compute_token_gae, x.row_lambda)),
        Case("turn_fast", turn(compute_turn_gae, 0.95)),
        Case("module_default", lambda: default(x.batch, x.meta)),
        Case("module_grpo", lambda: grpo(x.batch, x.meta)),
        Case("token_loop", token(token_gae_loop, 0.95), slow=True),
        Case("turn_slot_loop", turn(turn_gae_loop, 0.95), slow=True),
        Case("turn_row_loop", turn(turn_gae_per_row, 0.95), slow=True),
    ]
    run_cases(cases, repeats, device)
    return {c.name: c for c in cases}


# ---------------------------------------------------------------------------- report


def _fmt_time(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def _fmt_ratio(value: float, target: Optional[float] = None, at_least: bool = True) -> str:
    text = f"{value:.1f}×" if value < 100 else f"{value:.0f}×"
    if target is None:
        return text
    ok = value >= target if at_least else value <= target
    return f"{text} {'✓' if ok else '✗'}"


TIME_COLUMNS = [
    ("clone_token", "clone (token inputs)"),
    ("token_loop", "token loop"),
    ("token_fast_1", "token fast γλ=1"),
    ("token_fast_095", "token fast γλ=0.95"),
    ("token_fast_row", "token fast λ[B]"),
    ("clone_turn", "clone (turn inputs)"),
    ("turn_row_loop", "turn per-row loop"),
    ("turn_slot_loop", "turn slot loop"),
    ("turn_fast", "turn fast"),
    ("module_default", "module default"),
    ("module_grpo", "module GRPO"),
]


def report(results: dict[tuple[str, int, int], dict[str, Case]]) -> str:
    lines = []
    for device in dict.fromkeys(key[0] for key in results):
        rows = [(key, cases) for key, cases in results.items() if key[0] == device]
        lines.append(f"### {device}\n")
        lines.append("Median wall time per call (repeats of the slow loops in brackets).\n")
        lines.append("| B×T | " + " | ".join(title for _, title in TIME_COLUMNS) + " |")
        lines.append("|---" * (len(TIME_COLUMNS) + 1) + "|")
        for (_, bs, width), cases in rows:
            cells = []
            for name, _ in TIME_COLUMNS:
                case = cases[name]
                cell = _fmt_time(case.median)
                if case.slow:
                    cell += f" ({len(case.times)})"
                cells.append(cell)
            lines.append(f"| {bs}×{width} | " + " | ".join(cells) + " |")
        lines.append("")
        lines.append("Ratios, ✓/✗ against the targets (set at 64×2048 for the token kernel, "
                     "shown at every size); \"kernel\" is the token kernel at γλ=1, the "
                     "estimator both module configs run.\n")
        lines.append("| B×T | token loop ÷ fast, γλ=0.95 (≥20×) | token fast ÷ clone, γλ=0.95 (≤8×) | "
                     "token fast ÷ clone, γλ=1 (≤8×) | turn per-row loop ÷ fast (≥5×) | "
                     "turn slot loop ÷ fast | module default ÷ kernel (≤2×) | "
                     "module GRPO ÷ kernel (≤2×) |")
        lines.append("|---" * 8 + "|")
        for (_, bs, width), c in rows:
            m = {name: case.median for name, case in c.items()}
            lines.append("| " + " | ".join([
                f"{bs}×{width}",
                _fmt_ratio(m["token_loop"] / m["token_fast_095"], TARGETS["token_vs_loop"]),
                _fmt_ratio(m["token_fast_095"] / m["clone_token"], TARGETS["token_vs_clone"], False),
                _fmt_ratio(m["token_fast_1"] / m["clone_token"], TARGETS["token_vs_clone"], False),
                _fmt_ratio(m["turn_row_loop"] / m["turn_fast"], TARGETS["turn_vs_row_loop"]),
                _fmt_ratio(m["turn_slot_loop"] / m["turn_fast"]),
                _fmt_ratio(m["module_default"] / m["token_fast_1"], TARGETS["module_vs_kernel"],
                           False),
                _fmt_ratio(m["module_grpo"] / m["token_fast_1"], TARGETS["module_vs_kernel"],
                           False),
            ]) + " |")
        lines.append("")
    return "\n".join(lines)


#: The pipeline steps of ``AdvantageModule.forward`` as (file suffix, function name).
PIPELINE_STEPS = (
    ("module.py", "forward"),
    ("batch_checks.py", "validate_batch"),
    ("rewards.py", "apply_length_penalty"),
    ("module.py", "shape_outcome"),
    ("module.py", "normalize_rewards"),
    ("alignment.py", "align_batch"),
    ("alignment.py", "place_outcome"),
    ("alignment.py", "temporal_inputs"),
    ("module.py", "estimate"),
    ("kernels.py", "compute_token_gae"),
    ("module.py", "normalize_advantages"),
    ("module.py", "shape_process"),
    ("module.py", "_output"),
)


def profile_module(name: str, module: AdvantageModule, x: Inputs, calls: int) -> str:
    """Time per call of each pipeline step (cProfile cumulative time), as markdown rows."""
    for _ in range(2):
        module(x.batch, x.meta)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        module(x.batch, x.meta)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    found = {}
    for (path, _, func), (_, _, _, cumulative, _) in stats.items():
        for suffix, step in PIPELINE_STEPS:
            if func == step and path.endswith(suffix):
                found[step] = found.get(step, 0.0) + cumulative / calls
    total = found.get("forward", float("nan"))
    rows = []
    for _, step in PIPELINE_STEPS:
        if step in found:
            label = "kernel (inside estimate)" if step == "compute_token_gae" else step
            rows.append(f"| {name} | {label} | {_fmt_time(found[step])} | "
                        f"{100 * found[step] / total:.0f}% |")
    return "\n".join(rows)


def tune_malloc() -> bool:
    """Stop glibc from returning large freed blocks to the OS (``mallopt``), as jemalloc or
    tcmalloc would. With glibc's defaults every call gets fresh pages for its [B, T]
    temporaries and pays the page faults; this shows the cost without them. Affects only
    this process; returns False where it is not available."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 32 << 20)) and \
        bool(libc.mallopt(m_trim_threshold, 1 << 30))


def parse_sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for item in text.split(","):
        try:
            bs, width = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"--sizes: expected BxT pairs like 64x2048, got "
                                             f"{item!r}") from None
        if bs < 1 or width < 2:
            raise argparse.ArgumentTypeError(f"--sizes: {item!r} needs B >= 1 and T >= 2")
        sizes.append((bs, width))
    return sizes


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lightning_adv.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=parse_sizes,
                        default=list(DEFAULT_SIZES),
                        help="comma-separated BxT sizes (default: "
                             + ",".join(f"{b}x{t}" for b, t in DEFAULT_SIZES) + ")")
    parser.add_argument("--repeats", type=int, default=20,
                        help="timed repeats per entry (slow loops: fewer, within "
                             f"{SLOW_BUDGET_S:g} s each)")
    parser.add_argument("--device", choices=("cpu", "cuda", "all"), default="all",
                        help="'all' = CPU, plus CUDA when available")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--profile-module", action="store_true",
                        help="also print where AdvantageModule spends its time, step by step "
                             "(cProfile, CPU, the largest size)")
    parser.add_argument("--tune-malloc", action="store_true",
                        help="keep freed memory in the process (glibc mallopt), so large "
                             "temporaries are not page-faulted in on every call")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    tuned = tune_malloc() if args.tune_malloc else False
    if args.tune_malloc and not tuned:
        parser.error("--tune-malloc: glibc mallopt is not available here")
    devices = []
    if args.device in ("cpu", "all"):
        devices.append(torch.device("cpu"))
    if args.device in ("cuda", "all") and torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    if args.device == "cuda" and not devices:
        parser.error("--device cuda: CUDA is not available")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads"
          + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "")
          + f", {args.repeats} repeats"
          + (", glibc malloc tuned (--tune-malloc)" if tuned else ", default allocator")
          + "\n", flush=True)
    results = {}
    for device in devices:
        for bs, width in args.sizes:
            print(f"{device.type} {bs}x{width} ...", flush=True)
            results[(device.type, bs, width)] = bench_size(bs, width, device, args.repeats)
    print()
    print(report(results))
    if args.profile_module:
        bs, width = max(args.sizes, key=lambda size: size[0] * size[1])
        x = realistic_inputs(bs, width, torch.device("cpu"))
        grpo = ActorConfig(kl_ctl=0.0, reward_norm=NormConfig(mean_level="group", std_level="group"))
        print(f"### AdvantageModule by pipeline step (cpu, {bs}×{width}, cProfile, per call)\n")
        print("| config | step | time | share |")
        print("|---|---|---|---|")
        print(profile_module("default", AdvantageModule(ActorConfig()), x, args.repeats))
        print(profile_module("GRPO", AdvantageModule(grpo), x, args.repeats))
        print()


if __name__ == "__main__":
    main()
