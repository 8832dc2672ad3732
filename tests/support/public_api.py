"""The public callables and their parameters, as recorded in ``tests/data/public_api.json``.

The public names are ``lightning_adv.__all__`` and the ``__all__`` of the integration
modules; for each function its parameters, for each class its constructor's and those of
its public methods defined in this package. A parameter is written ``name`` (positional
or keyword), ``*name`` (keyword-only), ``*args`` / ``**kwargs``. The file's ``deprecated``
part lists the old names still accepted, each with its replacement: module names
(``lightning_adv.TrajBatchMeta``) and parameters (``AdaptiveKLController(init_kl_coef)``).

After adding a name or a parameter, re-record (the deprecated part is kept)::

    python -m tests.support.public_api
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path
from typing import Any

RECORDED = Path(__file__).resolve().parents[1] / "data" / "public_api.json"
#: The modules whose ``__all__`` is public API, and the extra each needs beyond [test].
MODULES = {"lightning_adv": None, "lightning_adv.integrations.verl": None,
           "lightning_adv.integrations.trl_advantages": None,
           "lightning_adv.integrations.trl": "trl"}


def parameters(fn: Any) -> list[str]:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature
        return []
    marks = {inspect.Parameter.KEYWORD_ONLY: "*", inspect.Parameter.VAR_POSITIONAL: "*",
             inspect.Parameter.VAR_KEYWORD: "**"}
    return [marks.get(p.kind, "") + p.name for p in signature.parameters.values()
            if p.name != "self"]


def _methods(cls: type) -> dict[str, list[str]]:
    """The public methods ``cls`` defines in this package (not torch's or TRL's)."""
    found = {}
    for klass in cls.__mro__:
        if not klass.__module__.startswith("lightning_adv"):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or f"{cls.__name__}.{name}" in found:
                continue
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if inspect.isfunction(value):
                found[f"{cls.__name__}.{name}"] = parameters(value)
    return found


def module_api(module_name: str) -> dict[str, list[str]]:
    """``{qualified name: parameters}`` of every public callable of ``module_name``."""
    module = importlib.import_module(module_name)
    api: dict[str, list[str]] = {}
    for name in module.__all__:
        value = getattr(module, name)
        if inspect.isclass(value):
            api[f"{module_name}.{name}"] = parameters(value)  # the constructor
            api.update({f"{module_name}.{k}": v for k, v in _methods(value).items()})
        elif callable(value):
            api[f"{module_name}.{name}"] = parameters(value)
    return api


def differences(recorded_api: dict[str, list[str]], current: dict[str, list[str]],
                deprecated_names: dict[str, str]) -> tuple[list[str], list[str]]:
    """``(broken, unrecorded)``: what callers of the recorded API would lose (a name, a
    parameter, a positional place), and what is new and not recorded yet."""
    broken, unrecorded = [], []
    for name, params in recorded_api.items():
        if name not in current:
            if name not in deprecated_names:
                broken.append(f"{name} was removed without a deprecation path")
            continue
        now = current[name]
        positional = [p for p in now if not p.startswith("*")]
        for i, param in enumerate(p for p in params if not p.startswith("*")):
            if param not in now:
                broken.append(f"{name}: parameter {param!r} was removed")
            elif i >= len(positional) or positional[i] != param:
                broken.append(f"{name}: positional parameter {param!r} moved (was number "
                              f"{i + 1}; now {positional})")
        broken += [f"{name}: parameter {param.lstrip('*')!r} was removed" for param in params
                   if param.startswith("*") and param not in now and param.lstrip("*") not in now]
        unrecorded += [f"{name}: parameter {p!r}" for p in now if p not in params]
    unrecorded += [name for name in current if name not in recorded_api]
    return broken, unrecorded


def recorded() -> dict[str, Any]:
    """The recorded file, each callable's parameters as a list."""
    data = json.loads(RECORDED.read_text())
    data["modules"] = {module: {name: [p for p in params.split(", ") if p]
                                for name, params in api.items()}
                       for module, api in data["modules"].items()}
    return data


def main() -> None:
    old = json.loads(RECORDED.read_text()) if RECORDED.exists() else {}
    modules = {module: {name: ", ".join(params) for name, params in module_api(module).items()}
               for module in MODULES}
    data = {"deprecated": old.get("deprecated", {"names": {}, "parameters": {}}),
            "modules": modules}
    # one callable a line: a change shows as one changed line in a diff
    text = json.dumps(data, indent=1, sort_keys=True)
    RECORDED.write_text(text + "\n")
    print(f"wrote {RECORDED}")


if __name__ == "__main__":
    main()
