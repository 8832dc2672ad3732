"""A griffe extension for the API reference (``mkdocs.yml``, mkdocstrings' ``extensions``):
the package's docstrings are written for Python readers and use reST roles
(``:class:`~lightning_adv.PPOLoss```) and literal-block markers (``rule::``), which
Markdown would print as they are. Each docstring goes through
``generate_reference.markdown`` (the same rule as the generated config page) when the
site is built; the package's docstrings stay as they are."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from griffe import Extension, Object


def _generate_reference() -> Any:
    path = Path(__file__).with_name("generate_reference.py")
    spec = importlib.util.spec_from_file_location("generate_reference", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


markdown = _generate_reference().markdown


class SphinxRoles(Extension):
    def on_instance(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
