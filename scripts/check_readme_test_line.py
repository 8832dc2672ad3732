"""Run the README's test line, verbatim, in a fresh virtual environment on a clean clone.

The README promises that its second line (``python3 -m venv .venv && ... && python -m
pytest -q``) passes on a fresh machine with only the ``[test]`` extra: the tests of the
other extras (verl, trl, docs) and the browser test must skip there, not fail. CI cannot
show it, since ``.ci/run`` installs those extras first; this script does::

    python scripts/check_readme_test_line.py             # clones HEAD, runs the line
    python scripts/check_readme_test_line.py --dry-run   # prints the line and the clone

The clone is ``git clone`` of this checkout's HEAD (committed work only) into a temporary
directory; the line runs under ``bash -e`` there with the LIGHTNING_ADV_REQUIRE_* variables,
PYTHONPATH and any active virtual environment removed from the environment, so nothing of
this machine's setup leaks in. It needs the network (pip) and takes as long as the suite.
``tests/docs/test_readme_test_line.py`` (slow) runs it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_test_line(readme: Path = ROOT / "README.md") -> str:
    """The README's line that installs the test extra and runs pytest (the first bash block)."""
    lines = [line for line in readme.read_text().splitlines()
             if line.startswith("python3 -m venv") and "pytest" in line]
    if len(lines) != 1:
        raise SystemExit(f"{readme}: expected one 'python3 -m venv ... pytest' line, got {lines}")
    return lines[0]


def clean_environment() -> dict[str, str]:
    """This environment without what would make the run differ from a fresh machine's."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LIGHTNING_ADV_REQUIRE_")
           and k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    venv_bin = os.environ.get("VIRTUAL_ENV")
    if venv_bin:  # an activated venv's bin/ would shadow python3
        env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                      if not p.startswith(venv_bin))
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print, run nothing")
    parser.add_argument("--keep", type=Path, help="clone into this (new) directory and keep it")
    args = parser.parse_args(argv)
    line = readme_test_line()
    if re.search(r"\bLIGHTNING_ADV_REQUIRE_", line):
        raise SystemExit("the README's line sets a LIGHTNING_ADV_REQUIRE_ variable: not a "
                         "fresh machine's run")
    with tempfile.TemporaryDirectory() as tmp:
        clone = args.keep or Path(tmp) / "clone"
        print(f"clone: {clone}\nline:  {line}", flush=True)
        if args.dry_run:
            return 0
        subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)],
                       check=True)
        run = subprocess.run(["bash", "-e", "-c", line], cwd=clone, env=clean_environment())
    print(f"the README's test line exited with status {run.returncode}")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
