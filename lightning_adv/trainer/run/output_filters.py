"""Output of the dependencies that says nothing to a user of the CLI, filtered.

Only messages that are about the dependencies themselves (their deprecations, their
advertisements, notes on choices the trainer made on purpose) are dropped; every warning
of this project, and every warning about the user's config, is shown.
"""

from __future__ import annotations

import logging
import warnings

#: (message regex, why it says nothing to the user) of the Python warnings dropped
IGNORED_WARNINGS = (
    (".*does not have many workers.*", "batches are prompt indices: workers would not help"),
    (".*Using ModelCheckpoint with manual optimization.*",
     "the post-update state is what a checkpoint of a finished PPO step should hold"),
    (".*module\\(s\\) in eval mode at the start of training.*",
     "a Hugging Face policy's frozen reference stays in eval mode on purpose"),
    (".*isinstance\\(treespec, LeafSpec\\)` is deprecated.*",
     "Lightning's own use of a torch API torch deprecated: nothing for the user to change"),
    (".*The dirpath has changed from .* won't be reloaded.*",
     "a resumed run in a new version_N, or an evaluation in eval/, keeps its checkpoints "
     "apart from the parent's on purpose (and the CLI says where it writes)"),
)

#: log records of Lightning's loggers dropped (message prefixes): advertisements
IGNORED_LOG_PREFIXES = ("💡 Tip:",)


#: the loggers Lightning's rank_zero_info writes through (which one depends on import order)
RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


class DropMessages(logging.Filter):
    """Drops the log records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.prefixes)

    def install(self) -> "DropMessages":
        for name in RANK_ZERO_LOGGERS:
            logging.getLogger(name).addFilter(self)
        return self

    def remove(self) -> None:
        for name in RANK_ZERO_LOGGERS:
            logging.getLogger(name).removeFilter(self)


_installed: list[DropMessages] = []


def quiet_dependency_noise() -> None:
    """Install the filters (once per process)."""
    for pattern, _why in IGNORED_WARNINGS:
        warnings.filterwarnings("ignore", pattern)
    if not _installed:
        _installed.append(DropMessages(IGNORED_LOG_PREFIXES).install())
