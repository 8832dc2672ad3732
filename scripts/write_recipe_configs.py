"""Write ``configs/advantage/<name>.yaml`` from the recipe table
(``lightning_adv/config/recipe_table.py``): ``python scripts/write_recipe_configs.py [DIR]``.
A test keeps the shipped files equal to what this writes."""

from __future__ import annotations

import sys
from pathlib import Path

from lightning_adv.recipes import write_recipe_files


def main(argv: list[str]) -> None:
    directory = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "configs" / "advantage"
    for path in write_recipe_files(directory):
        print(path)


if __name__ == "__main__":
    main(sys.argv[1:])
