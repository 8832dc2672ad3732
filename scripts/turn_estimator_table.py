"""The table of the agents guide that measures ``turn_rloo`` and the ``turn_index_norm``
shortcut against exact values: the sample of ``tests/core/test_turn_estimators.py``
(``tests/support/turn_problem.py``: 1,000 prompt groups of 16 episodes, seed 0), each
estimator's mean advantage per (turn, action) minus the exact one, in standard errors
(prompt groups as clusters), and its policy gradient per turn. A second or two on a CPU.

    python scripts/turn_estimator_table.py                                # print the table
    python scripts/turn_estimator_table.py --page docs/guides/agents.md   # write it there

``--page`` replaces the table between the page's ``turn-estimators`` markers;
``tests/docs/test_turn_estimator_table.py`` checks that the page holds exactly this output.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the sampler is the tests' (package ``tests`` of this checkout)
    sys.path.insert(0, str(ROOT))


if str(ROOT / "scripts") not in sys.path:  # (the table writer beside this script)
    sys.path.insert(0, str(ROOT / "scripts"))
from marked_tables import replace_marked, table_command  # noqa: E402

from lightning_adv import AdvantageModule  # noqa: E402
from lightning_adv.recipes import recipe  # noqa: E402
from tests.support.turn_problem import (  # noqa: E402
    TurnProblem, advantage_errors, gradient_estimates, sample)

GROUPS, SIZE, SEED = 1000, 16, 0
#: (name on the page, the recipe's advantage override): the shortcut without the std, as the
#: guide's formula writes it.
ESTIMATORS = (("turn_rloo", None),
              ("turn_index_norm", {"estimator": {"implementation": "turn_index_norm",
                                                 "kwargs": {"std_normalize": False}}}))
#: The table's columns: (turn, action) of the turns with a choice.
CELLS = ((0, "continue"), (0, "stop"), (1, "continue"))
BEGIN, END = "<!-- turn-estimators:begin -->\n", "\n<!-- turn-estimators:end -->"


def signed(x: float) -> str:
    return f"{x:+.3f}".replace("-", "−")


def standard_errors(z: float) -> str:
    return f"{z:.1f}" if z < 10 else f"{z:.0f}"


def rows() -> list[str]:
    problem = TurnProblem()
    batch, meta, info = sample(problem, GROUPS, SIZE, seed=SEED)
    turns = info["turns"]
    out = []
    for name, advantage in ESTIMATORS:
        config = recipe("turn_rloo", **({"advantage": advantage} if advantage else {}))
        result = AdvantageModule(config)(batch, meta)
        errors = advantage_errors(problem, result, turns, SIZE)
        cells = [f"{signed(mean)} ({standard_errors(abs(mean) / se)} SE)"
                 for mean, se in (errors[cell] for cell in CELLS)]
        gradient = ", ".join(signed(g) for g, _ in gradient_estimates(problem, result, turns, SIZE))
        out.append(f"| `{name}` | " + " | ".join(cells) + f" | {gradient} |")
    return out


def markdown() -> str:
    return "\n".join([
        "| estimator | A_0(call) − exact | A_0(answer) − exact | A_1(call) − exact "
        "| gradient (turn 0, turn 1) |",
        "|---|---|---|---|---|",
        *rows()])


def replace_table(text: str, table: str) -> str:
    """``text`` with the table between this script's markers replaced."""
    return replace_marked(text, BEGIN, END, table)


if __name__ == "__main__":
    table_command(markdown, BEGIN, END, __doc__.split("\n\n")[0])
