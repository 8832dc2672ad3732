"""The one conversion of nested configs (mappings from YAML into config dataclasses) and
the JSON check of keyword-argument mappings, shared by every config of the package."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any, Optional

from lightning_adv._checks import fail


def check_json_kwargs(key: str, kwargs: Any) -> None:
    """Kwargs must be a string-keyed mapping that survives a JSON round trip unchanged."""
    if not isinstance(kwargs, Mapping):
        fail(key, "a mapping of keyword arguments", kwargs)
    for name in kwargs:
        if not isinstance(name, str) or not name.isidentifier():
            fail(key, "keyword names that are Python identifiers", name)
    try:
        round_trip = json.loads(json.dumps(dict(kwargs), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{key}: expected JSON values only (strings, finite numbers, "
                         f"booleans, null, lists, mappings), got {dict(kwargs)!r}: {exc}") from None
    if round_trip != dict(kwargs):
        raise ValueError(f"{key}: expected JSON values only (tuples, sets and other Python "
                         f"objects do not survive saving the config), got {dict(kwargs)!r}")


def nested_config(cls: type, key: str, value: Any, shorthand: Optional[str] = None) -> Any:
    """The one conversion of a nested config: a mapping (or a ``shorthand`` string, the
    value of field ``shorthand``) becomes a ``cls`` instance; anything else is returned
    as is for the caller's type check. Errors of the nested config name ``key`` (its
    place in the tree) instead of the class's own name (``cls.KEY``, where it has one).
    Every config of the package, the trainer's too, converts its nested fields with it."""
    if shorthand is not None and isinstance(value, str):
        value = {shorthand: value}
    if not isinstance(value, Mapping):
        return value
    # jsonargparse records where a section loaded from its own file came from
    # (``--model.actor=configs/advantage/grpo.yaml``); that is not a field.
    value = {k: v for k, v in value.items() if k != "__path__"}
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - names)
    if unknown:
        raise ValueError(f"{key}: unknown keys {unknown}; expected some of {sorted(names)}")
    try:
        return cls(**value)
    except ValueError as exc:
        if not hasattr(cls, "KEY"):
            raise
        # Re-key at the boundary: every key the nested config named (``advantage.x``)
        # gets its place in the tree (``actor.advantage.x``).
        own = re.compile(rf"(?<![\w.]){re.escape(cls.KEY)}(?=[.:])")
        message, count = own.subn(key, str(exc))
        if count:
            raise ValueError(message) from None
        raise


def _own_kwargs(kwargs: Any) -> Any:
    """A private copy of a kwargs mapping (None: no kwargs); other values are left for
    validation to reject."""
    if kwargs is None:
        return {}
    return dict(kwargs) if isinstance(kwargs, Mapping) else kwargs


def convert_field(obj: Any, name: str, value: Any) -> None:
    """Store a converted field value; called only from ``__post_init__``, before
    ``validate``, so a config never changes after it was checked."""
    object.__setattr__(obj, name, value)

