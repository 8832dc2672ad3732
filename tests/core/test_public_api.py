"""Every public callable keeps its parameters (tests/data/public_api.json): a name or a
parameter that disappears, or a positional one that moves, fails here unless a deprecation
path keeps the old spelling working (listed in the file's ``deprecated`` part)."""

import importlib
import inspect

import pytest

from tests.support.peers import require_extra
from tests.support.public_api import MODULES, differences, recorded, module_api

RERECORD = "re-record with: python -m tests.support.public_api"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_public_parameter_disappears_without_a_deprecation_path(module):
    if MODULES[module]:
        require_extra(MODULES[module])
    data = recorded()
    broken, unrecorded = differences(data["modules"][module], module_api(module),
                                     data["deprecated"]["names"])
    assert not broken, ("the public API lost (keep the old spelling with a DeprecationWarning "
                        f"and list it under 'deprecated' in tests/data/public_api.json): {broken}")
    assert not unrecorded, f"new public API not in tests/data/public_api.json ({RERECORD}): {unrecorded}"


def test_the_deprecated_names_still_import_with_a_warning_naming_the_new_one():

    for old, new in recorded()["deprecated"]["names"].items():
        module, _, name = old.rpartition(".")
        with pytest.warns(DeprecationWarning, match=f"use {new}"):
            getattr(importlib.import_module(module), name)


def test_the_deprecated_parameters_are_still_accepted_and_documented():
    for owner, renamed in recorded()["deprecated"]["parameters"].items():
        module, _, name = owner.rpartition(".")
        target = getattr(importlib.import_module(module), name)
        accepted = inspect.signature(target).parameters
        for old, new in renamed.items():
            assert old in accepted and new in accepted, (owner, old, new)
            assert f"{old}: deprecated name of ``{new}``" in inspect.getdoc(target), owner


def test_the_check_catches_a_removed_or_moved_parameter():
    recorded_api = {"m.f": ["a", "b", "*c"], "m.g": ["x"], "m.Old": []}
    broken, unrecorded = differences(recorded_api, {"m.f": ["b", "a", "d"]}, {"m.Old": "m.New"})
    assert broken == ["m.f: positional parameter 'a' moved (was number 1; now ['b', 'a', 'd'])",
                      "m.f: positional parameter 'b' moved (was number 2; now ['b', 'a', 'd'])",
                      "m.f: parameter 'c' was removed",
                      "m.g was removed without a deprecation path"]
    assert unrecorded == ["m.f: parameter 'd'"]
    assert differences({"m.f": ["a"]}, {"m.f": ["a", "*b"], "m.h": []}, {}) == (
        [], ["m.f: parameter '*b'", "m.h"])
