"""The verl guide's table of where this project's estimators differ from verl 0.9.1's:
each row's largest difference of the advantages (on the generated tokens) between verl's
released estimator and the ``la_`` one, both called through verl's registry on the
batches of ``tests/integrations/test_verl_estimators.py`` (its ``responses``: groups in
shuffled order, tool spans, outcome-only and per-token rewards, seeds 0, 1, 2), with the
same keyword arguments as its tests. Needs verl 0.9.1 (the pinned ``core_algos.py``); a
few seconds on a CPU.

    python scripts/verl_differences.py                               # print the table
    python scripts/verl_differences.py --page docs/guides/verl.md    # write it there

``--page`` replaces the table between the page's ``verl-differences`` markers;
``tests/docs/test_verl_differences.py`` checks that the page holds exactly this output.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the batches are the tests' (package ``tests`` of this checkout)
    sys.path.insert(0, str(ROOT))


if str(ROOT / "scripts") not in sys.path:  # (the table writer beside this script)
    sys.path.insert(0, str(ROOT / "scripts"))
from marked_tables import replace_marked, table_command  # noqa: E402

from tests.integrations.test_verl_estimators import (  # noqa: E402
    EQUAL_CASES, WHITENED, WITH_TOOL_SPANS, both, gap, responses, verl_kwargs)
from tests.support.peers import VERL_CORE_ALGOS, peer_module  # noqa: E402

SEEDS = (0, 1, 2)
BEGIN, END = "<!-- verl-differences:begin -->\n", "\n<!-- verl-differences:end -->"


def cases(names, *, dense=(False, True), tools=lambda name: True, tails=(None,)) -> Iterator[tuple]:
    for name in names:
        for seed in SEEDS:
            for d in dense:
                for tail in tails:
                    yield name, responses(seed, dense=d, tools=tools(name)), tail


def largest(core, algo_config: type, measured: Iterator[tuple], **config) -> float:
    """The largest difference over ``measured``'s (name, data, handle_zero_tail) cases."""
    out = 0.0
    for name, data, tail in measured:
        kw = verl_kwargs(name, data, algo_config(**config))
        if tail is not None:
            kw["handle_zero_tail"] = tail
        ours, theirs = both(core, name, kw)
        out = max(out, gap(ours, theirs, data["response_mask"]))
    return out


def sig2(x: float) -> str:
    """Two significant digits, the exponent without padding (2.4e-7)."""
    text = f"{x:.2g}"
    if "e" in text:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}e{int(exponent)}"
    return text


#: (verl estimator(s), measured: (core, AlgoConfig) -> largest difference or a text, why)
ROWS: list[tuple[str, Callable, str]] = [
    ("`grpo`, `rloo`, `opo`, `grpo_passk`, `remax`, `tir_optimal_token_baseline`, and "
     "`optimal_token_baseline` on responses without tool spans (`handle_zero_tail` true or false)",
     lambda core, cfg: sig2(largest(core, cfg, (
         (name, responses(seed, dense=d, tools=name in WITH_TOOL_SPANS), tail)
         for name, tail in EQUAL_CASES for seed in SEEDS for d in (False, True)),
         gamma=0.95, lam=0.9)) + " (float32 rounding)",
     "-"),
    ("`gae`, `reinforce_plus_plus`, `reinforce_plus_plus_baseline`",
     lambda core, cfg: sig2(largest(core, cfg, cases(WHITENED), gamma=0.95, lam=0.9)),
     "whitening: verl divides by `sqrt(var + 1e-8)`, this project by `std + 1e-5`; the "
     "returns are equal"),
    ("`gpg`",
     lambda core, cfg: sig2(largest(core, cfg, cases(["gpg"], dense=(False,)))),
     "the rescaling: verl 0.9.1 multiplies by `B / (non-zero rewards)`, this project by "
     "`B / (B - M)`, M the responses of all-equal groups (the GPG paper); one factor per batch"),
    ("`gdpo`",
     lambda core, cfg: sig2(largest(core, cfg, cases(["gdpo"], dense=(False,)))),
     "the final whitening: verl whitens over tokens (each row weighted by its length), this "
     "project over rows (TRL's `normalize_then_sum`); equal up to one affine map per batch"),
    ("`optimal_token_baseline`, responses with a tool span",
     lambda core, cfg: sig2(largest(core, cfg, cases(["optimal_token_baseline"], dense=(True,)))),
     "this project numbers the steps by generated token (its masked-token rule, verl's "
     "`tir_optimal_token_baseline`); verl's `optimal_token_baseline` by column. Groups without "
     "a tool span are equal"),
    ("`grpo` with a one-response group",
     lambda core, cfg: "the reward",
     "verl uses mean 0, std 1 (advantage `r / (1 + 1e-6)`); this project gives it 0 (no peer "
     "to compare with)"),
]


def markdown() -> str:
    import warnings

    core = peer_module(*VERL_CORE_ALGOS)
    from lightning_adv.integrations.verl import register
    from verl.trainer.config import AlgoConfig

    register()
    lines = ["| verl estimator | largest difference of the advantages | why |", "|---|---|---|"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for names, measured, why in ROWS:
            lines.append(f"| {names} | {measured(core, AlgoConfig)} | {why} |")
    return "\n".join(lines)


def replace_table(text: str, table: str) -> str:
    """``text`` with the table between this script's markers replaced."""
    return replace_marked(text, BEGIN, END, table)


if __name__ == "__main__":
    table_command(markdown, BEGIN, END, __doc__.split("\n\n")[0])
