"""This project's ``tests`` package is the one every test imports, never the top-level
``tests`` package verl 0.9.1 installs into site-packages (its RECORD lists 154 ``tests/``
files): tests/conftest.py refuses another one, and the child processes the helpers start
put the repository root first."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import sysconfig
import types
from pathlib import Path

import pytest

from tests.conftest import TESTS, check_tests_package

REPO = TESTS.parent


def test_every_loaded_tests_module_is_this_checkouts():
    loaded = {name: getattr(module, "__file__", None) for name, module in sys.modules.items()
              if name == "tests" or name.startswith("tests.")}
    elsewhere = {name: path for name, path in loaded.items()
                 if path is not None and not Path(path).resolve().is_relative_to(TESTS)}
    assert "tests.conftest" in loaded and not elsewhere, elsewhere


def test_a_shadowing_tests_package_is_refused_naming_where_it_came_from(tmp_path):
    fake = types.ModuleType("tests")
    fake.__file__ = str(tmp_path / "site-packages" / "tests" / "__init__.py")
    with pytest.raises(ImportError, match=r"imported from .*site-packages/tests, not from this "
                                          r"checkout's .*verl 0\.9\.1 installs one"):
        check_tests_package(fake)
    check_tests_package(sys.modules["tests"])


def test_a_child_started_as_the_helpers_start_them_imports_this_tests_package(tmp_path):
    """From another directory, with the repository first on PYTHONPATH (doc_blocks,
    without_package and the example runs do this), ``tests`` is this checkout's even
    where site-packages holds verl's."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", "import tests, tests.support.peers; "
                          "print(tests.__file__)"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert Path(run.stdout.strip()).resolve() == TESTS / "__init__.py"


def test_verl_really_installs_a_top_level_tests_package():
    """Why the guard exists (skips without verl, like every peer test)."""
    from tests.support.peers import require_extra

    require_extra("verl")
    files = importlib.metadata.distribution("verl").files or []
    shipped = [f for f in files if str(f).startswith("tests/")]
    assert len(shipped) > 100 and any(str(f) == "tests/__init__.py" for f in shipped)
    site = Path(sysconfig.get_paths()["purelib"])
    if (site / "tests" / "__init__.py").exists():  # installed beside ours: never imported
        assert Path(sys.modules["tests"].__file__).resolve().parent != site / "tests"
