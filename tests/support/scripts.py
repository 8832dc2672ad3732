"""The repository's scripts (``scripts/*.py``) as modules, for the tests of what they write."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py``, imported once (dataclasses need it in ``sys.modules``)."""
    key = f"scripts_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, SCRIPTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def shown_command(script: str, args: list[str]) -> str:
    """How a benchmark page shows ``python <script> <args>``: absolute paths outside the
    checkout (a test's temporary files) by their names only, as the harness writes them
    (``benchmarks/harness.py``, no machine's paths on a page)."""
    shown = [Path(a).name if Path(a).is_absolute() else a for a in args]
    return f"{script} {' '.join(shown)}"
