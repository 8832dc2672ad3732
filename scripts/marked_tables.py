"""A generated table between two HTML comments of a docs page: the one way the scripts
that write such tables (``recipe_differences.py``, ``verl_differences.py``,
``turn_estimator_table.py``) replace it, and their shared command line (print the table,
or ``--page PATH`` to write it into the page's markers)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def replace_marked(text: str, begin: str, end: str, table: str) -> str:
    """``text`` with what stands between its ``begin`` and ``end`` markers replaced by
    ``table``."""
    if begin not in text or end not in text:
        raise SystemExit(f"no {begin.strip()} ... {end.strip()} markers in the page")
    return text[:text.index(begin) + len(begin)] + table + text[text.index(end):]


def table_command(markdown: Callable[[], str], begin: str, end: str, description: str) -> None:
    """Print ``markdown()``, or with ``--page PATH`` write it between the page's markers."""
    import torch

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--page", type=Path, help="write the table into this page's markers")
    args = parser.parse_args()
    torch.set_num_threads(1)
    table = markdown()
    if args.page is None:
        print(table)
    else:
        args.page.write_text(replace_marked(args.page.read_text(), begin, end, table))
        print(f"wrote {args.page}")
