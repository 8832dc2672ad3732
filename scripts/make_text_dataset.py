"""Write the JSON-lines prompt file of a shipped text task (``task.dataset``).

    python scripts/make_text_dataset.py --task reverse --n 2000 --seed 0 --out data/reverse_text.jsonl
    python scripts/make_text_dataset.py --task sum --n 3000 --seed 0 --distinct --out data/sum_chat.jsonl

Each line is ``{"prompt": "Reverse: cab", "answer": "bac"}`` (``reverse``) or
``{"prompt": "3+5=", "answer": "8"}`` (``addition``): the built-in tasks written as text,
for ``lightning_adv.trainer.tasks.text.char_match`` / ``exact_match``. The same
arguments write the same file; ``data/reverse_text.jsonl`` and ``data/sum_chat.jsonl``
(``sum``: chat messages whose last is the start of the answer, for ``number_match``) are
these commands' output.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lightning_adv.trainer.tasks.text import TEXT_TASKS, write_text_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="reverse", choices=sorted(TEXT_TASKS))
    parser.add_argument("--n", type=int, default=2000, help="records to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--distinct", action="store_true",
                        help="no prompt twice (the held-out lines are then prompts training never saw)")
    args = parser.parse_args()
    path = write_text_dataset(args.out, args.task, args.n, args.seed, args.distinct)
    print(f"wrote {args.n} {args.task} records to {path}")


if __name__ == "__main__":
    main()
