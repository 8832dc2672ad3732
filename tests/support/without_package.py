"""A Python child process in which an installed package is not installed.

Blocking the import alone (``sys.modules["matplotlib"] = None``) is not the same: other
libraries ask the package metadata whether it is installed (torchmetrics does for
matplotlib), find it, import it and fail. So the child runs without ``site`` (``-S``) on
a copy of this interpreter's site-packages made of links to every entry but the
package's modules and metadata: to every library in it, the package was never installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_without(names: tuple[str, ...], code: str, scratch: Path,
                timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``code`` in a child Python whose site-packages lacks every entry starting with
    one of ``names`` (modules, packages, ``*.dist-info``); this checkout first on its path."""
    site = Path(sysconfig.get_paths()["purelib"])
    shadow = scratch / "site-packages"
    shadow.mkdir(parents=True)
    for entry in site.iterdir():
        if not entry.name.lower().startswith(names) and entry.suffix != ".pth":
            (shadow / entry.name).symlink_to(entry)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(shadow)])}
    return subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)
