from __future__ import annotations

import argparse
import cProfile
import ctypes
import datetime
import os
import platform
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from lightning_adv import ActorConfig, AdvantageModule, compute_token_gae, compute_turn_gae, native
from lightning_adv.loops import token_gae_loop, turn_gae_loop, turn_gae_per_row
from lightning_adv.openmp import wait_policy_note
from lightning_adv.recipes import recipe
from lightning_adv.testing.synthetic import Inputs, realistic_inputs
from lightning_adv.workspace import Workspace

DEFAULT_SIZES = ((8, 512), (64, 2048), (256, 4096), (16, 16384))
DEFAULT_THREADS = (1, 2)
#: Time budget (seconds) for the repeats of one slow reference loop at one size.
SLOW_BUDGET_S = 3.0
ROOT = Path(__file__).resolve().parents[1]

TARGETS = {
    "token_vs_loop": 20.0,     # token GAE at least 20x the loop (at B=64, T=2048)
    "token_vs_clone": 8.0,     # ... and within 8x of the clone (64x2048 and above)
    "turn_vs_row_loop": 5.0,   # turn GAE at least 5x the per-row loop
    "module_vs_kernel": 1.5,   # the whole module at most 1.5x its kernel call (3x at 8x512)
    "module_vs_kernel_small": 3.0,
    "peak_tensors": 20.0,      # peak memory of a module call, in [B, T] float32 tensors
}
#: A thread count whose time exceeds the first count's by more than this is flagged.
SLOWER = 1.05


def module_configs() -> dict[str, ActorConfig]:
    """The benchmarked module configs: the default, ``configs/ppo.yaml``'s actor (when the
    source tree is at hand) and the ``grpo`` recipe."""
    configs = {"default": ActorConfig()}
    path = ROOT / "configs" / "ppo.yaml"
    if path.exists():
        import yaml

        configs["ppo.yaml"] = ActorConfig(**yaml.safe_load(path.read_text())["model"]["actor"])
    configs["GRPO"] = recipe("grpo")
    return configs


# ---------------------------------------------------------------------------- timing


@dataclass
class Case:
    name: str
    fn: Callable[[], object]
    slow: bool = False
    threads: Optional[int] = None
    times: list[float] = field(default_factory=list)
    repeats: int = 0

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def _time_once(case: Case, device: torch.device) -> float:
    if case.threads is not None and torch.get_num_threads() != case.threads:
        torch.set_num_threads(case.threads)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    case.fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def run_cases(cases: Sequence[Case], repeats: int, device: torch.device) -> None:
    """Warm up the fast cases, time one run of each slow case to set its repeats, then
    time round by round, every case once per round (slow ones until their repeats end),
    in a new order each round: with glibc's allocator the case after one that freed large
    blocks pays the page faults of getting them back, and no case should always be it."""
    for case in cases:
        if case.slow:
            case.times.append(_time_once(case, device))
            case.repeats = max(1, min(repeats, int(SLOW_BUDGET_S / case.times[0])))
        else:
            for _ in range(2):
                _time_once(case, device)
            case.repeats = repeats
    order = random.Random(0)
    for _ in range(repeats):
        for case in order.sample(list(cases), len(cases)):
            if len(case.times) < case.repeats:
                case.times.append(_time_once(case, device))


def _torch_path(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` with the torch kernels and torch steps (as on CUDA, or without the native
    library), with reused temporaries where a module would reuse them."""
    workspace = Workspace()

    def run() -> object:
        with native.disabled(), workspace.active():
            return fn()
    return run


def bench_size(bs: int, width: int, device: torch.device, repeats: int,
               threads: Sequence[Optional[int]] = (None,),
               configs: Optional[dict[str, ActorConfig]] = None) -> dict[Optional[int], dict[str, Case]]:
    """Every case at every thread count, interleaved; ``{threads: {name: case}}``."""
    x = realistic_inputs(bs, width, device)
    token_args = (x.rewards, x.values, x.loss_mask)
    turn_args = (x.rewards, x.values, x.loss_mask, x.turn_ids)

    def token(fn, lam, discount=1.0):
        return lambda: fn(*token_args, bootstrap_values=x.bootstrap, discount=discount,
                          gae_lambda=lam)

    def turn(fn, lam):
        return lambda: fn(*turn_args, bootstrap_values=x.bootstrap, discount=1.0, gae_lambda=lam)

    configs = module_configs() if configs is None else configs
    by_threads: dict[Optional[int], dict[str, Case]] = {}
    for count in threads:
        cases = [
            Case("clone_token", lambda: [t.clone() for t in (*token_args, x.bootstrap)]),
            Case("clone_turn", lambda: [t.clone() for t in (*turn_args, x.bootstrap)]),
            Case("token_fast_1", token(compute_token_gae, 1.0)),
            Case("token_fast_095", token(compute_token_gae, 0.95)),
            Case("token_fast_row", token(compute_token_gae, x.row_lambda)),
            Case("turn_fast", turn(compute_turn_gae, 0.95)),
            Case("token_torch_1", _torch_path(token(compute_token_gae, 1.0))),
            Case("token_torch_095", _torch_path(token(compute_token_gae, 0.95))),
            Case("turn_torch", _torch_path(turn(compute_turn_gae, 0.95))),
        ]
        for name, config in configs.items():
            module = AdvantageModule(config)
            cases.append(Case(f"module {name}", lambda m=module: m(x.batch, x.meta)))
            torch_module = AdvantageModule(config)
            cases.append(Case(f"torch module {name}",
                              _torch_path(lambda m=torch_module: m(x.batch, x.meta))))
        if count == threads[0]:
            cases += [Case("token_loop", token(token_gae_loop, 0.95), slow=True),
                      Case("turn_slot_loop", turn(turn_gae_loop, 0.95), slow=True),
                      Case("turn_row_loop", turn(turn_gae_per_row, 0.95), slow=True)]
        for case in cases:
            case.threads = count
        by_threads[count] = {case.name: case for case in cases}
    run_cases([c for cases in by_threads.values() for c in cases.values()], repeats, device)
    return by_threads


SCALING_ROWS = 16
SCALING_WIDTHS = (2048, 4096, 8192, 16384, 32768)
#: Target: at most this factor per doubling of T (linear time, some cache effects).
PER_DOUBLING = 2.3


def bench_scaling(device: torch.device, repeats: int,
                  widths: Optional[Sequence[int]] = None) -> dict[int, dict[str, Case]]:
    """The token kernel at B = 16 and growing T, interleaved: ``{T: {name: case}}``."""
    by_width: dict[int, dict[str, Case]] = {}
    for width in SCALING_WIDTHS if widths is None else widths:
        x = realistic_inputs(SCALING_ROWS, width, device)
        args = (x.rewards, x.values, x.loss_mask)

        def token(lam, args=args, x=x):
            return lambda: compute_token_gae(*args, bootstrap_values=x.bootstrap, discount=1.0,
                                             gae_lambda=lam)
        cases = [Case("clone_token", lambda args=args: [t.clone() for t in args]),
                 Case("token_fast_1", token(1.0)), Case("token_fast_095", token(0.95)),
                 Case("token_torch_1", _torch_path(token(1.0))),
                 Case("token_torch_095", _torch_path(token(0.95)))]
        by_width[width] = {case.name: case for case in cases}
    run_cases([c for cases in by_width.values() for c in cases.values()], repeats, device)
    return by_width


def scaling_report(by_width: dict[int, dict[str, Case]]) -> str:
    names = ["clone_token", "token_fast_1", "token_fast_095", "token_torch_1", "token_torch_095"]
    lines = [f"### Kernel time against T (B = {SCALING_ROWS}): time and ratio to the previous T "
             f"(target ≤{PER_DOUBLING}× per doubling)\n"]
    rows, previous = [], None
    for width, cases in by_width.items():
        cells = [str(width)]
        for name in names:
            cell = _fmt_time(cases[name].median)
            if previous is not None:
                ratio = cases[name].median / previous[name].median
                mark = "" if name == "clone_token" else (" ✓" if ratio <= PER_DOUBLING else " ✗")
                cell += f" ({ratio:.2f}×{mark})"
            cells.append(cell)
        rows.append(cells)
        previous = cases
    return "\n".join(lines + _table(["T"] + names, rows) + [""])


def kernel_case(config: ActorConfig) -> str:
    """The bare kernel call a module config makes (its token GAE at its γλ)."""
    coef = config.discount * config.gae_lambda
    return "token_fast_1" if coef == 1.0 else "token_fast_095"


# ---------------------------------------------------------------------------- memory


class _HeapPeak(TorchDispatchMode):
    """The largest heap in use (glibc ``mallinfo2``) after any torch operation inside."""

    def __init__(self, in_use: Callable[[], int]):
        super().__init__()
        self.in_use = in_use
        self.peak = in_use()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, self.in_use())
        return out


def _heap_in_use() -> Optional[Callable[[], int]]:
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return None

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    mallinfo2.restype = MallInfo2

    def in_use() -> int:
        info = mallinfo2()
        return info.uordblks + info.hblkhd
    return in_use


def module_peak_tensors(module: AdvantageModule, x: "Inputs") -> Optional[float]:
    """Peak memory of one module call in [B, T] float32 tensors: the largest heap growth
    during the call (sampled after every torch operation; outputs included) plus the
    scratch memory the module keeps between calls. CPU and glibc only."""
    in_use = _heap_in_use()
    if in_use is None or x.loss_mask.device.type != "cpu":
        return None
    module(x.batch, x.meta)  # warm: the workspace holds its buffers
    growth = []
    for _ in range(3):  # the least of three: other allocations of the process are noise
        before = in_use()
        with _HeapPeak(in_use) as probe:
            out = module(x.batch, x.meta)
        del out
        growth.append(probe.peak - before)
    one = x.loss_mask.numel() * 4
    return (min(growth) + module.workspaces.nbytes) / one


# ---------------------------------------------------------------------------- report


def _fmt_time(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def _fmt_ratio(value: float, target: Optional[float] = None, at_least: bool = True) -> str:
    text = f"{value:.2f}×" if value < 10 else (f"{value:.1f}×" if value < 100 else f"{value:.0f}×")
    if target is None:
        return text
    ok = value >= target if at_least else value <= target
    return f"{text} {'✓' if ok else '✗'}"


KERNEL_COLUMNS = [
    ("clone_token", "clone (token inputs)"),
    ("token_loop", "token loop"),
    ("token_fast_1", "token fast γλ=1"),
    ("token_fast_095", "token fast γλ=0.95"),
    ("token_torch_1", "token torch γλ=1"),
    ("token_torch_095", "token torch γλ=0.95"),
    ("token_fast_row", "token fast λ[B]"),
    ("clone_turn", "clone (turn inputs)"),
    ("turn_row_loop", "turn per-row loop"),
    ("turn_slot_loop", "turn slot loop"),
    ("turn_fast", "turn fast"),
    ("turn_torch", "turn torch"),
]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"] + \
        ["| " + " | ".join(row) + " |" for row in rows]


def report(results: dict[tuple[str, int, int], dict[Optional[int], dict[str, Case]]],
           peaks: Optional[dict[tuple[str, int, int], dict[str, Optional[float]]]] = None,
           configs: Optional[dict[str, ActorConfig]] = None,
           traffic: Optional[dict[tuple[str, int, int], dict[str, tuple[float, float]]]] = None
           ) -> str:
    """Markdown tables: times, kernel ratios, module ratios (with memory traffic and peak
    memory), and threads."""
    configs = module_configs() if configs is None else configs
    peaks, traffic = peaks or {}, traffic or {}
    lines = []
    for device in dict.fromkeys(key[0] for key in results):
        sizes = [key for key in results if key[0] == device]
        thread_counts = list(results[sizes[0]])
        for count in thread_counts:
            label = f"{device}, {count} thread{'s' * (count != 1)}" if count else device
            lines.append(f"### {label}\n")
            lines += _time_table(results, sizes, count)
            lines += _kernel_ratio_table(results, sizes, count, thread_counts[0])
            lines += _module_table(results, peaks, configs, sizes, count, traffic)
        if len(thread_counts) > 1:
            lines += _thread_table(results, sizes, thread_counts)
    return "\n".join(lines)


def _time_table(results, sizes, count) -> list[str]:
    lines = ["Median wall time per call (repeats of the slow loops in brackets); \"fast\": "
             "the kernels as called (the C loops on the CPU), \"torch\": the torch kernels "
             "(as on CUDA, or without the native library), temporaries reused.\n"]
    rows = []
    for key in sizes:
        cases = results[key][count]
        cells = [f"{key[1]}×{key[2]}"]
        for name, _ in KERNEL_COLUMNS:
            case = cases.get(name)
            if case is None:
                cells.append("")
                continue
            cell = _fmt_time(case.median)
            cells.append(cell + (f" ({len(case.times)})" if case.slow else ""))
        rows.append(cells)
    return lines + _table(["B×T"] + [title for _, title in KERNEL_COLUMNS], rows) + [""]


def _kernel_ratio_table(results, sizes, count, loop_count) -> list[str]:
    """Ratios against the targets; the slow loops are timed at the first thread count only."""
    lines = ["Kernel ratios, ✓/✗ against the targets (set at 64×2048 and above for "
             "the clone ratios, shown at every size).\n"]
    rows = []
    for key in sizes:
        m = {n: c.median for n, c in results[key][count].items()}
        loops = {n: c.median for n, c in results[key][loop_count].items()}
        rows.append([f"{key[1]}×{key[2]}",
                     _fmt_ratio(loops["token_loop"] / m["token_fast_095"],
                                TARGETS["token_vs_loop"]),
                     *[_fmt_ratio(m[n] / m["clone_token"], TARGETS["token_vs_clone"], False)
                       for n in ("token_fast_1", "token_fast_095", "token_torch_1",
                                 "token_torch_095")],
                     _fmt_ratio(m["token_torch_095"] / m["token_fast_095"]),
                     _fmt_ratio(loops["turn_row_loop"] / m["turn_fast"],
                                TARGETS["turn_vs_row_loop"]),
                     _fmt_ratio(loops["turn_slot_loop"] / m["turn_fast"]),
                     _fmt_ratio(m["turn_torch"] / m["turn_fast"])])
    lines += _table(["B×T", "token loop ÷ fast, γλ=0.95 (≥20×)",
                     "fast ÷ clone, γλ=1 (≤8×)", "fast ÷ clone, γλ=0.95 (≤8×)",
                     "torch ÷ clone, γλ=1", "torch ÷ clone, γλ=0.95",
                     "torch ÷ fast, γλ=0.95", "turn per-row loop ÷ fast (≥5×)",
                     "turn slot loop ÷ fast", "turn torch ÷ fast"], rows)
    return lines + [""]


def module_traffic(module: AdvantageModule, x: "Inputs") -> tuple[float, float]:
    """Bytes per ``[B, T]`` position that one module call and its bare kernel call must move
    at least: the ``[B, T]`` tensors the default pipeline reads, plus its new ``[B, T]``
    outputs; the kernel reads three and writes two ``[B, T]`` tensors."""
    out = module(x.batch, x.meta)
    shape = x.loss_mask.shape
    read = sum(x.batch[key].element_size() for key in
               ("attention_mask", "loss_mask", "logprobs", "ref_logp", "values") if key in x.batch)
    inputs = {id(v) for v in x.batch.values()}
    outputs = {id(v): v for v in out.values() if isinstance(v, Tensor)
               and v.shape == shape and id(v) not in inputs}  # (prox_logp is logprobs)
    written = sum(v.element_size() for v in outputs.values())
    return float(read + written), float(5 * x.rewards.element_size())


def _module_table(results, peaks, configs, sizes, count, traffic) -> list[str]:
    lines = ["The module against the kernel call it makes (the token kernel at its "
             "γλ: 1 for default and GRPO, 0.95 for ppo.yaml); target ≤1.5× (≤3× at "
             "8×512). \"torch module\": the same call with the torch steps and kernels "
             "(as on CUDA, or without the native library). Bytes: what one call must at "
             "least read and write per [B, T] position (its [B, T] inputs, its new [B, T] "
             "outputs), against the kernel's. Peak: the most memory one call holds "
             "(outputs and kept scratch included), in [B, T] float32 tensors (target "
             "≤20).\n"]
    rows = []
    for key in sizes:
        m = {n: c.median for n, c in results[key][count].items()}
        target = TARGETS["module_vs_kernel_small"] if key[1] * key[2] <= 8 * 512 \
            else TARGETS["module_vs_kernel"]
        for name, config in configs.items():
            kernel = kernel_case(config)
            peak = peaks.get(key, {}).get(name)
            moved, kernel_moved = traffic.get(key, {}).get(name, (float("nan"), float("nan")))
            rows.append([f"{key[1]}×{key[2]}", name, _fmt_time(m[f"module {name}"]),
                         _fmt_ratio(m[f"module {name}"] / m[kernel], target, False),
                         _fmt_time(m[f"torch module {name}"]),
                         _fmt_ratio(m[f"torch module {name}"] / m[f"module {name}"]),
                         f"{moved:.0f} ÷ {kernel_moved:.0f} = {moved / kernel_moved:.1f}×",
                         "" if peak is None else
                         f"{peak:.1f} {'✓' if peak <= TARGETS['peak_tensors'] else '✗'}"])
    return lines + _table(["B×T", "config", "module", "÷ bare kernel", "torch module",
                           "torch ÷ module", "bytes/position ÷ kernel's",
                           "peak [B,T] f32"], rows) + [""]


THREAD_CASES = ("clone_token", "token_fast_1", "token_fast_095", "token_torch_095",
                "turn_fast")


def _thread_table(results, sizes, thread_counts) -> list[str]:
    base = thread_counts[0]
    names = list(THREAD_CASES) + [n for n in results[sizes[0]][base] if n.startswith("module ")]
    lines = [f"### threads: time with more threads ÷ time with {base}\n",
             f"⚠ marks a case that is slower with more threads (by more than "
             f"{100 * (SLOWER - 1):.0f}%).\n"]
    rows = []
    for key in sizes:
        for count in thread_counts[1:]:
            cells = [f"{key[1]}×{key[2]}", str(count)]
            for name in names:
                ratio = results[key][count][name].median / results[key][base][name].median
                cells.append(f"{ratio:.2f}" + (" ⚠" if ratio > SLOWER else ""))
            rows.append(cells)
    return lines + _table(["B×T", "threads"] + names, rows) + [""]


#: The pipeline steps of ``AdvantageModule.forward`` as (file suffix, function name, label).
PIPELINE_STEPS = (
    ("module.py", "forward", "forward"),
    ("batch_checks.py", "validate_batch", "validate_batch"),
    ("rewards.py", "apply_length_penalty", "apply_length_penalty"),
    ("module.py", "shape_outcome", "shape_outcome"),
    ("module.py", "normalize_rewards", "normalize_rewards"),
    ("module.py", "align_and_estimate", "align_and_estimate (steps 4-8)"),
    ("fused.py", "align_and_estimate", "fused native pass (inside)"),
    ("alignment.py", "align_batch", "align_batch"),
    ("alignment.py", "place_outcome", "place_outcome"),
    ("module.py", "estimate", "estimate"),
    ("kernels.py", "compute_token_gae", "kernel (inside estimate)"),
    ("module.py", "normalize_advantages", "normalize_advantages"),
    ("module.py", "shape_process", "shape_process"),
    ("module.py", "_output", "_output"),
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
        for suffix, step, label in PIPELINE_STEPS:
            if func == step and path.endswith(suffix):
                found[label] = found.get(label, 0.0) + cumulative / calls
    total = found.get("forward", float("nan"))
    rows = []
    for _, _, label in PIPELINE_STEPS:
        if label in found:
            rows.append(f"| {name} | {label} | {_fmt_time(found[label])} | "
                        f"{100 * found[label] / total:.0f}% |")
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


def machine_note() -> str:
    """Machine, date and load, for the header of a run."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(line.split(":", 1)[1].strip() for line in cpuinfo
                         if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{model}, {os.cpu_count()} cores, {datetime.date.today().isoformat()}, "
            f"load average {load:.2f}")


def build_parser() -> argparse.ArgumentParser:
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
    parser.add_argument("--threads", type=int, nargs="+", default=list(DEFAULT_THREADS),
                        help="torch CPU thread counts, timed side by side (default: 1 2)")
    parser.add_argument("--profile-module", action="store_true",
                        help="also print where AdvantageModule spends its time, step by step "
                             "(cProfile, CPU, the largest size)")
    parser.add_argument("--tune-malloc", action="store_true",
                        help="keep freed memory in the process (glibc mallopt), so large "
                             "temporaries are not page-faulted in on every call")
    parser.add_argument("--no-scaling", dest="scaling", action="store_false",
                        help=f"skip the kernel-against-T series (B = {SCALING_ROWS}, T = "
                             f"{SCALING_WIDTHS[0]}..{SCALING_WIDTHS[-1]}, first thread count)")
    parser.add_argument("--trainer", action="store_true",
                        help="benchmark the trainer's step instead (python -m "
                             "lightning_adv.bench_trainer; the other arguments go to it, e.g. "
                             "--trainer --steps 20 --threads 1 2)")
    return parser


def print_module_profile(sizes, threads: int, calls: int, configs: dict[str, ActorConfig]) -> None:
    torch.set_num_threads(threads)
    bs, width = max(sizes, key=lambda size: size[0] * size[1])
    x = realistic_inputs(bs, width, torch.device("cpu"))
    print(f"### AdvantageModule by pipeline step (cpu, {bs}×{width}, cProfile, per call)\n")
    print("| config | step | time | share |")
    print("|---|---|---|---|")
    for name, config in configs.items():
        print(profile_module(name, AdvantageModule(config), x, calls))
    print()


def selected_devices(choice: str) -> list[torch.device]:
    """``cpu``, ``cuda`` or ``all`` (the CPU, plus CUDA when available)."""
    devices = []
    if choice in ("cpu", "all"):
        devices.append(torch.device("cpu"))
    if choice in ("cuda", "all") and torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    return devices


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--trainer" in argv:  # the rest of the arguments are the trainer benchmark's
        from lightning_adv import bench_trainer

        bench_trainer.main([a for a in argv if a != "--trainer"])
        return
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if any(t < 1 for t in args.threads):
        parser.error("--threads: thread counts must be at least 1")
    tuned = tune_malloc() if args.tune_malloc else False
    if args.tune_malloc and not tuned:
        parser.error("--tune-malloc: glibc mallopt is not available here")
    devices = selected_devices(args.device)
    if args.device == "cuda" and not devices:
        parser.error("--device cuda: CUDA is not available")
    print(f"{machine_note()}; torch {torch.__version__}, threads {' and '.join(map(str, args.threads))}"
          + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "")
          + f", {args.repeats} repeats"
          + (", glibc malloc tuned (--tune-malloc)" if tuned else ", default allocator")
          + f"; {wait_policy_note()}\n", flush=True)
    configs = module_configs()
    results, peaks, traffic = {}, {}, {}
    for device in devices:
        for bs, width in args.sizes:
            print(f"{device.type} {bs}x{width} ...", flush=True)
            key = (device.type, bs, width)
            results[key] = bench_size(bs, width, device, args.repeats, args.threads, configs)
            x = realistic_inputs(bs, width, device)
            peaks[key] = {name: module_peak_tensors(AdvantageModule(config), x)
                          for name, config in configs.items()}
            traffic[key] = {name: module_traffic(AdvantageModule(config), x)
                            for name, config in configs.items()}
    scaling = None
    if args.scaling:
        torch.set_num_threads(args.threads[0])
        print(f"cpu scaling B={SCALING_ROWS} ...", flush=True)
        scaling = bench_scaling(torch.device("cpu"), args.repeats)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}\n")
    print(report(results, peaks, configs, traffic))
    if scaling is not None:
        print(scaling_report(scaling))
    if args.profile_module:
        print_module_profile(args.sizes, args.threads[0], args.repeats, configs)


if __name__ == "__main__":
    main()
