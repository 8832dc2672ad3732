"""Deprecated: the tiny model maker is :mod:`lightning_adv.trainer.policies.hf.make_tiny`, and the
command ``python -m lightning_adv make-tiny --out DIR``.

``python -m lightning_adv.hf make-tiny ...`` still works (with a note), and so do imports
from here (with a ``DeprecationWarning``).
"""

from __future__ import annotations

import sys
import warnings
from typing import Optional, Sequence

from lightning_adv.trainer.policies.hf.policy import no_progress_bars
from lightning_adv.trainer.policies.hf.make_tiny import (
    ARCHITECTURES, CHAT_TEMPLATE, CORPUS_WORDS, END_OF_TEXT, IM_END, IM_START, build_model,
    build_tokenizer, make_tiny, task_corpus)
from lightning_adv.trainer.policies.hf.make_tiny import main as _make_tiny_main

warnings.warn("lightning_adv.hf is deprecated: import lightning_adv.trainer.policies.hf.make_tiny, and "
              "run python -m lightning_adv make-tiny --out DIR", DeprecationWarning, stacklevel=2)

__all__ = ["ARCHITECTURES", "CHAT_TEMPLATE", "CORPUS_WORDS", "END_OF_TEXT", "IM_END", "IM_START",
           "build_model", "build_tokenizer", "make_tiny", "no_progress_bars", "task_corpus"]


def main(argv: Optional[Sequence[str]] = None) -> None:
    """The old ``python -m lightning_adv.hf make-tiny ...``."""
    print("note: python -m lightning_adv.hf is deprecated; run python -m lightning_adv "
          "make-tiny --out DIR", file=sys.stderr)
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["make-tiny"]:
        raise SystemExit("usage: python -m lightning_adv make-tiny --out DIR "
                         "(python -m lightning_adv.hf is deprecated)")
    _make_tiny_main(args[1:])


if __name__ == "__main__":
    main()
