"""The peers' released code, pinned: a test that claims equality with verl, TRL or
another framework imports the installed package through :func:`peer_module`, which
checks the sha256 of the source file the test relies on, so a different release fails
the test with a message instead of silently comparing against other code.

Tests that need a peer are marked ``@pytest.mark.peers``. When the peer is not
installed they are skipped (with the install command as the reason), or fail when the
environment variable ``LIGHTNING_ADV_REQUIRE_PEERS=1`` is set (CI sets it).

Peers that cannot be installed here (code at a pinned commit of a repository, or a
wheel that does not import on this Python) are not imported at all: a script of ours
runs their function once and records inputs and outputs as a data fixture under
``tests/data/`` (with the commit, the file path and its sha256); :func:`recorded_cases`
loads one and checks that it names the pinned file.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

import pytest

#: How CI installs the peers (the pins are in constraints.txt).
INSTALL = {
    "verl": "pip install -c constraints.txt --no-deps verl==0.9.1 (plus ray, tensordict, "
            "omegaconf, codetiming, orjson)",
    "trl": "pip install -c constraints.txt trl==1.16.0",
}
DATA = Path(__file__).resolve().parents[1] / "data"


def peers_required() -> bool:
    return os.environ.get("LIGHTNING_ADV_REQUIRE_PEERS") == "1"


def sha256_of(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def peer_module(name: str, sha256: str, install: Optional[str] = None) -> ModuleType:
    """The installed module ``name`` whose source file has the given sha256.

    Skips the calling test when the peer's package is not importable (fails instead
    under ``LIGHTNING_ADV_REQUIRE_PEERS=1``); fails, naming both hashes and the file,
    when the installed file is not the pinned one.
    """
    package = name.split(".")[0]
    how = install or INSTALL.get(package, f"pip install {package}")
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        message = f"peer {name!r} is not importable ({exc}); install it: {how}"
        if peers_required():
            pytest.fail(f"{message} (LIGHTNING_ADV_REQUIRE_PEERS=1)")
        pytest.skip(message)
    source = getattr(module, "__file__", None)
    if source is None:
        pytest.fail(f"peer {name!r} has no source file to check against the pinned sha256")
    actual = sha256_of(source)
    if actual != sha256:
        pytest.fail(f"peer {name!r}: {source} has sha256 {actual}, but the test was written "
                    f"against the file with sha256 {sha256}; install the pinned release ({how}) "
                    f"or re-check the test against the new code and update the pin")
    return module


def recorded_cases(filename: str, *, source: str, sha256: str) -> dict[str, Any]:
    """A recorded-peer fixture of ``tests/data/``, checked to come from the pinned file
    (``source``: the file's path in its repository or wheel)."""
    path = DATA / filename
    data = json.loads(path.read_text())
    peer = data.get("peer", {})
    if peer.get("file") != source or peer.get("sha256") != sha256:
        pytest.fail(f"{path}: recorded from {peer.get('file')!r} (sha256 {peer.get('sha256')}), "
                    f"but the test expects {source!r} with sha256 {sha256}; re-record it (see "
                    f"the script named in the file's 'recorded_by')")
    return data
