"""Time the advantage computation through the package's public entry points.

On batches of :func:`lightning_adv.testing.synthetic.realistic_inputs` (prompt groups of
8 rows, 1-4 generated turns with tool-output gaps, right padding, a quarter of the rows
truncated), at each ``--threads`` count, in one process, it times:

- ``clone()`` of the kernel's input tensors: the memory-speed floor;
- ``lightning_adv.compute_token_gae`` at γλ = 1, at γλ = 0.95 and with a per-row λ, and
  ``lightning_adv.compute_turn_gae`` at γλ = 0.95, as user code calls them;
- the reference loops (``lightning_adv.testing.reference_gae``, ``lightning_adv.testing.reference_gae`` in
  older trees) at the first thread count, with fewer repeats where they are slow;
- one ``AdvantageModule(config)(batch, meta)`` call for ``ActorConfig()``, the ``grpo``
  recipe and the actor section of each ``configs/*.yaml``.

Cases run round by round, every case once per round in a new order (with glibc's
allocator the case after one that freed large blocks pays the page faults of getting
them back, and no case should always be that one); times are medians::

    python benchmarks/advantage.py --sizes 8x512,64x2048 --threads 1 2 --page advantage.md
"""

from __future__ import annotations

import argparse
import importlib
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import harness

DEFAULT_SIZES = ((8, 512), (64, 2048), (256, 4096), (16, 16384))
DEFAULT_THREADS = (1,)
#: Time budget (seconds) for the repeats of one slow reference loop at one size.
SLOW_BUDGET_S = 3.0
#: The reference loops, where each tree keeps them (the newest first).
LOOP_MODULES = ("lightning_adv.testing.reference_gae", "lightning_adv.testing.reference_gae")
LOOPS = {"token_gae_loop": ("token loop", "token"), "turn_gae_loop": ("turn slot loop", "turn"),
         "turn_gae_per_row": ("turn per-row loop", "turn")}
#: The kernel calls timed at every size: (kernel, discount, λ); module configs add theirs.
KERNELS = (("token", 1.0, 1.0), ("token", 1.0, 0.95), ("turn", 1.0, 0.95))
#: The discount and λ of the reference loops' runs (one of the kernel calls of KERNELS).
LOOP_COEFFICIENTS = (1.0, 0.95)

if __name__ == "__main__":
    harness.set_thread_environment(max(harness.threads_from_argv(sys.argv[1:], DEFAULT_THREADS)))
    harness.use_this_checkout()

import torch  # noqa: E402  (after the thread settings: OpenMP reads them when torch loads)

from lightning_adv import (  # noqa: E402
    ActorConfig, AdvantageModule, compute_token_gae, compute_turn_gae)
from lightning_adv.testing.synthetic import (  # noqa: E402
    Inputs, module_configs, realistic_inputs, with_stage_inputs)


@dataclass
class Case:
    name: str
    fn: Callable[[], object]
    threads: int
    slow: bool = False
    times: list[float] = field(default_factory=list)
    repeats: int = 0

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def _time_once(case: Case, device: torch.device) -> float:
    if torch.get_num_threads() != case.threads:
        torch.set_num_threads(case.threads)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    case.fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def run_cases(cases: Sequence[Case], repeats: int, device: torch.device) -> None:
    """Warm up the fast cases and time one run of each slow case to set its repeats (as
    many as fit in :data:`SLOW_BUDGET_S`), then time round by round in a new order."""
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


def reference_loops() -> tuple[str, dict[str, Callable[..., Any]]]:
    """The module holding the reference loops in this tree, and the loops it has."""
    for name in LOOP_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and name.startswith(exc.name):
                continue
            raise
        return name, {fn: getattr(module, fn) for fn in LOOPS if hasattr(module, fn)}
    return "none found", {}


def coefficients_name(discount: float, lam: float) -> str:
    return f"γ={discount:g} λ={lam:g}"


def kernel_name(kernel: str, discount: float, lam: float) -> str:
    return f"{kernel} {coefficients_name(discount, lam)}"


def kernel_of(config: ActorConfig) -> Optional[tuple[str, float, float]]:
    """The kernel call a module config makes, where it is a plain token or turn GAE with a
    number for λ (``None`` otherwise)."""
    spec = getattr(config.advantage, "estimator", None)
    implementation = "token_gae" if spec is None else spec.implementation
    kernel = {"token_gae": "token", "turn_gae": "turn"}.get(implementation)
    if kernel is None or not isinstance(config.gae_lambda, (int, float)):
        return None
    return kernel, float(config.discount), float(config.gae_lambda)


def size_cases(x: Inputs, threads: int, kernels: Sequence[tuple[str, float, float]],
               configs: dict[str, ActorConfig], loops: dict[str, Callable[..., Any]]
               ) -> list[Case]:
    """Every case at one size and thread count (``loops``: the reference loops to time)."""
    token_args = (x.rewards, x.values, x.loss_mask)
    turn_args = (*token_args, x.turn_ids)

    def call(kernel: str, fn: Callable[..., Any], discount: float, lam: Any) -> Callable[[], Any]:
        args = token_args if kernel == "token" else turn_args
        return lambda: fn(*args, bootstrap_values=x.bootstrap, discount=discount, gae_lambda=lam)

    entry = {"token": compute_token_gae, "turn": compute_turn_gae}
    cases = [Case("clone token inputs", lambda: [t.clone() for t in (*token_args, x.bootstrap)],
                  threads),
             Case("clone turn inputs", lambda: [t.clone() for t in (*turn_args, x.bootstrap)],
                  threads)]
    cases += [Case(kernel_name(*k), call(k[0], entry[k[0]], k[1], k[2]), threads)
              for k in kernels]
    cases.append(Case("token γ=1 λ per row", call("token", compute_token_gae, 1.0, x.row_lambda),
                      threads))
    for name, config in configs.items():
        module = AdvantageModule(config)
        batch = with_stage_inputs(x.batch, module.required_batch_keys,
                                  torch.Generator().manual_seed(0))
        cases.append(Case(f"module {name}", lambda m=module, b=batch: m(b, x.meta), threads))
    for fn_name, fn in loops.items():
        label, kernel = LOOPS[fn_name]
        cases.append(Case(label, call(kernel, fn, *LOOP_COEFFICIENTS), threads, slow=True))
    return cases


def bench_size(bs: int, width: int, device: torch.device, repeats: int, threads: Sequence[int],
               configs: dict[str, ActorConfig], loops: dict[str, Callable[..., Any]]
               ) -> dict[int, dict[str, Case]]:
    """Every case at every thread count, interleaved: ``{threads: {name: case}}``."""
    x = realistic_inputs(bs, width, device)
    kernels = list(dict.fromkeys([*KERNELS, *filter(None, map(kernel_of, configs.values()))]))
    by_threads = {}
    for count in threads:
        cases = size_cases(x, count, kernels, configs, loops if count == threads[0] else {})
        by_threads[count] = {case.name: case for case in cases}
    run_cases([c for cases in by_threads.values() for c in cases.values()], repeats, device)
    return by_threads


# ---------------------------------------------------------------------------- report


Results = dict[tuple[str, int, int], dict[int, dict[str, Case]]]


def _cell(case: Optional[Case]) -> str:
    if case is None:
        return ""
    return harness.format_time(case.median) + (f" ({len(case.times)})" if case.slow else "")


def time_table(results: Results, sizes: list[tuple[str, int, int]], count: int,
               first: int) -> str:
    """Median time per call of the kernels, the clones and the loops."""
    names = [n for n in results[sizes[0]][count] if not n.startswith("module ")]
    names += [n for n in results[sizes[0]][first] if results[sizes[0]][first][n].slow
              and n not in names]
    rows = []
    for key in sizes:
        cases = {**results[key][first], **results[key][count]}
        rows.append([f"{key[1]}×{key[2]}", *(_cell(cases.get(n)) for n in names)])
    return (f"Median time per call (the reference loops, at {coefficients_name(*LOOP_COEFFICIENTS)}"
            ": at the first thread count, with their number of runs in brackets).\n\n"
            + harness.table(["B×T", *names], rows))


def ratio_table(results: Results, sizes: list[tuple[str, int, int]], count: int,
                first: int) -> str:
    """Each kernel against the clone of its inputs, and each loop against its kernel."""
    kernels = [n for n in results[sizes[0]][count]
               if n.startswith(("token γ", "turn γ"))]
    loops = [n for n, c in results[sizes[0]][first].items() if c.slow]
    rows = []
    for key in sizes:
        m = {n: c.median for n, c in results[key][count].items()}
        slow = {n: c.median for n, c in results[key][first].items()}
        cells = [f"{key[1]}×{key[2]}"]
        cells += [harness.format_ratio(m[n] / m[f"clone {n.split()[0]} inputs"]) for n in kernels]
        cells += [harness.format_ratio(slow[n] / m[kernel_name(n.split()[0], *LOOP_COEFFICIENTS)])
                  for n in loops]
        rows.append(cells)
    header = [f"{n} ÷ clone" for n in kernels] + [f"{n} ÷ kernel" for n in loops]
    return ("Each kernel call against the `clone()` of its inputs (the memory-speed floor), "
            "and each reference loop against the kernel call computing the same "
            f"({coefficients_name(*LOOP_COEFFICIENTS)}).\n\n"
            + harness.table(["B×T", *header], rows))


def module_table(results: Results, sizes: list[tuple[str, int, int]], count: int,
                 configs: dict[str, ActorConfig]) -> str:
    rows = []
    for key in sizes:
        m = {n: c.median for n, c in results[key][count].items()}
        for name, config in configs.items():
            kernel = kernel_of(config)
            module = m[f"module {name}"]
            rows.append([f"{key[1]}×{key[2]}", name, harness.format_time(module),
                         "" if kernel is None else
                         f"{harness.format_ratio(module / m[kernel_name(*kernel)])} "
                         f"({kernel_name(*kernel)})",
                         harness.format_ratio(module / m["clone token inputs"])])
    return ("One `AdvantageModule(config)(batch, meta)` call, against the kernel call it "
            "makes (token or turn GAE at its γ and λ) and against the `clone()` of the "
            "token kernel's inputs.\n\n"
            + harness.table(["B×T", "config", "module", "÷ its kernel call",
                             "÷ clone token inputs"], rows))


def thread_table(results: Results, sizes: list[tuple[str, int, int]],
                 counts: Sequence[int]) -> str:
    base = counts[0]
    names = [n for n, c in results[sizes[0]][base].items() if not c.slow]
    rows = []
    for key in sizes:
        for count in counts[1:]:
            rows.append([f"{key[1]}×{key[2]}", str(count)]
                        + [f"{results[key][count][n].median / results[key][base][n].median:.2f}"
                           for n in names])
    return (f"Time with more threads ÷ time with {base}.\n\n"
            + harness.table(["B×T", "threads", *names], rows))


def report(results: Results, configs: dict[str, ActorConfig], counts: Sequence[int]
           ) -> list[str]:
    sections = []
    for device in dict.fromkeys(key[0] for key in results):
        sizes = [key for key in results if key[0] == device]
        for count in counts:
            sections.append(f"## {device}, {count} thread{'s' * (count != 1)}\n")
            sections.append(time_table(results, sizes, count, counts[0]))
            sections.append(ratio_table(results, sizes, count, counts[0]))
            sections.append(module_table(results, sizes, count, configs))
        if len(counts) > 1:
            sections.append(f"## {device}: threads\n")
            sections.append(thread_table(results, sizes, counts))
    return sections


# ---------------------------------------------------------------------------- command line


def parse_sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for item in text.split(","):
        try:
            bs, width = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected BxT pairs like 64x2048, got "
                                             f"{item!r}") from None
        if bs < 1 or width < 2:
            raise argparse.ArgumentTypeError(f"{item!r} needs B >= 1 and T >= 2")
        sizes.append((bs, width))
    return sizes


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python benchmarks/advantage.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=parse_sizes, default=list(DEFAULT_SIZES),
                        help="comma-separated BxT sizes (default: "
                             + ",".join(f"{b}x{t}" for b, t in DEFAULT_SIZES) + ")")
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per case (the "
                        f"reference loops: fewer, within {SLOW_BUDGET_S:g} s each)")
    parser.add_argument("--threads", type=int, nargs="+", default=list(DEFAULT_THREADS),
                        help="torch intra-op thread counts, timed side by side (default: 1)")
    parser.add_argument("--device", choices=("cpu", "cuda", "all"), default="all",
                        help="'all': the CPU, plus CUDA when available")
    parser.add_argument("--configs", nargs="+", metavar="NAME",
                        help="module configs to time (default: all of default, GRPO and "
                             "each configs/*.yaml, e.g. ppo.yaml)")
    parser.add_argument("--page", type=Path, help="also write the results as a markdown page")
    return parser


def selected_configs(parser: argparse.ArgumentParser, names: Optional[list[str]]
                     ) -> dict[str, ActorConfig]:
    configs = module_configs(harness.ROOT / "configs")
    unknown = sorted(set(names or ()) - set(configs))
    if unknown:
        parser.error(f"--configs: unknown {', '.join(unknown)}; expected some of "
                     f"{', '.join(configs)}")
    return configs if names is None else {name: configs[name] for name in names}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    devices = [torch.device("cpu")] if args.device in ("cpu", "all") else []
    if args.device in ("cuda", "all") and torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    if not devices:
        parser.error("--device cuda: CUDA is not available")
    configs = selected_configs(parser, args.configs)
    loop_module, loops = reference_loops()
    header = harness.page_header("Advantage computation: kernels and module calls", [
        f"Threads: {harness.thread_note(args.threads)}",
        f"Devices: {', '.join(d.type for d in devices)}"
        + (f" ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else ""),
        f"{args.repeats} timed runs per case; lightning_adv from "
        f"{harness.check_package_home(harness.ROOT)}; reference loops: {loop_module}"])
    print(header, flush=True)
    results: Results = {}
    for device in devices:
        for bs, width in args.sizes:
            print(f"{device.type} {bs}x{width} ...", flush=True)
            results[(device.type, bs, width)] = bench_size(bs, width, device, args.repeats,
                                                           args.threads, configs, loops)
    harness.write_page(args.page, header, report(results, configs, args.threads))


if __name__ == "__main__":
    main()
