"""OpenMP's wait policy for this package's own programs, chosen before torch loads.

With more than one intra-op thread, OpenMP's worker threads spin while they wait for
work (GNU OpenMP's default). On a machine with spare cores that is fastest; on a busy
one (two cores, other processes running) a spinning thread holds a core that the thread
it waits for needs, and torch operations run up to 25 times slower. ``PASSIVE`` makes
waiting threads sleep.

libgomp reads ``OMP_WAIT_POLICY`` once, when torch loads it, so it must be in the
environment before the first ``import torch``. ``lightning_adv/__init__.py`` calls
:func:`prefer_passive_wait` first thing: when the running program is one of this
package's (``python -m lightning_adv``, ``python -m lightning_adv.bench``,
``python -m lightning_adv.bench_trainer``, ``.bench_hf``, ``.hf``, the ``lightning-adv``
script) and torch is not
loaded yet, it sets ``OMP_WAIT_POLICY=PASSIVE`` unless the variable is already set.
Importing the library from your own program changes nothing. Opt out by setting the
variable yourself (``OMP_WAIT_POLICY=ACTIVE python -m lightning_adv ...``).
"""

from __future__ import annotations

import os
import sys

PROGRAMS = ("lightning_adv", "lightning_adv.bench", "lightning_adv.bench_trainer",
            "lightning_adv.bench_hf", "lightning_adv.hf", "lightning_adv.__main__")
SCRIPTS = ("lightning-adv",)
#: Set (to the value chosen) when :func:`prefer_passive_wait` set ``OMP_WAIT_POLICY``.
MARKER = "LIGHTNING_ADV_SET_OMP_WAIT_POLICY"


def running_program(argv: list[str]) -> bool:
    """Whether ``argv`` (``sys.orig_argv``: the interpreter's own command line) runs one
    of this package's programs."""
    if "-m" in argv[1:]:
        i = argv.index("-m", 1)
        return i + 1 < len(argv) and argv[i + 1] in PROGRAMS
    return len(argv) > 1 and os.path.basename(argv[1]) in SCRIPTS


def prefer_passive_wait() -> None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` for this package's programs (see the module doc)."""
    if "torch" in sys.modules or "OMP_WAIT_POLICY" in os.environ:
        return
    if running_program(list(getattr(sys, "orig_argv", sys.argv))):
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.environ[MARKER] = "PASSIVE"


def wait_policy_note() -> str:
    """One line for benchmark headers: the policy OpenMP runs with, and who chose it."""
    value = os.environ.get("OMP_WAIT_POLICY")
    if value is None:
        return "OMP_WAIT_POLICY unset (GNU OpenMP spins while waiting)"
    if os.environ.get(MARKER) == value:
        return f"OMP_WAIT_POLICY={value} (set by lightning_adv before torch loaded)"
    return f"OMP_WAIT_POLICY={value} (from the environment)"
