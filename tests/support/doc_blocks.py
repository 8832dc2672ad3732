"""The fenced code blocks of the README and the documentation site, and running them.

A block runs unless it is marked ``not run`` with a reason, in one of two ways:

- an HTML comment on the line before the fence (invisible on GitHub and on the site)::

      <!-- not run: needs a GPU -->
      ```python

- a title on the fence (the site shows it above the block)::

      ```python title="not run: needs a GPU"

The Python blocks of one page run in order in one fresh process, sharing their names, as
a reader runs them top to bottom; the shell blocks run one by one with ``bash -e``. Both
run in a scratch directory that holds links to the repository's ``configs/``, ``data/``,
``examples/``, ``scripts/`` and ``benchmarks/``, with the repository on ``PYTHONPATH`` and
``python`` meaning the interpreter running the tests, so nothing a block writes
(``runs/``, ``models/``) lands in the checkout.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
PYTHON = ("python", "py")
SHELL = ("bash", "sh", "shell")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)(?P<attrs>.*)$")
COMMENT_MARKER = re.compile(r"^\s*<!--\s*not run\b(?P<rest>.*?)-->\s*$")
TITLE = re.compile(r'title="(?P<title>[^"]*)"')


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    """line number of the opening fence (1-based)"""
    language: str
    code: str
    marker: Optional[str]
    """the text after ``not run`` (``": needs a GPU"``), or None when the block runs"""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.marker is None

    @property
    def reason(self) -> str:
        """The reason a block is not run ("" when it has none)."""
        text = (self.marker or "").strip()
        return text[1:].strip() if text.startswith(":") else ""

    @property
    def kind(self) -> Optional[str]:
        if self.language in PYTHON:
            return "python"
        if self.language in SHELL:
            return "shell"
        return None


def documents() -> list[Path]:
    """The README, CONTRIBUTING and every page of the site."""
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, with its not-run marker."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        body, j = [], i + 1
        while j < len(lines):
            closing = FENCE.match(lines[j])
            if (closing and closing["fence"][0] == fence[0] and len(closing["fence"]) >= len(fence)
                    and not closing["lang"] and not closing["attrs"].strip()):
                break
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
            j += 1
        marker = None
        title = TITLE.search(opening["attrs"])
        if title and title["title"].strip().lower().startswith("not run"):
            marker = title["title"].strip()[len("not run"):]
        previous = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        comment = COMMENT_MARKER.match(previous)
        if comment:
            marker = comment["rest"]
        found.append(Block(path, i + 1, opening["lang"].lower(), textwrap.dedent("\n".join(body)),
                           marker))
        i = j + 1
    return found


def code_blocks(kind: str) -> list[Block]:
    return [b for path in documents() for b in blocks(path) if b.kind == kind]


def scratch_directory(root: Path) -> Path:
    """A working directory for the blocks: links to the repository's ``configs/``,
    ``data/``, ``examples/``, ``scripts/`` and ``benchmarks/``, and a
    ``bin/`` whose ``python`` is this interpreter."""
    for name in ("configs", "data", "examples", "scripts", "benchmarks"):
        (root / name).symlink_to(REPO / name)
    bin_dir = root / ".bin"
    bin_dir.mkdir()
    for name in ("python", "python3"):  # a wrapper, not a link: a venv is found from its path
        wrapper = bin_dir / name
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        wrapper.chmod(0o755)
    return root


def environment(root: Path) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PATH": f"{root / '.bin'}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH"))
                                         if p)}
    env.pop("MPLBACKEND", None)
    return env


RUNNER = """
import json, sys, traceback
namespace = {"__name__": "__main__"}
for where, code in json.load(sys.stdin):
    try:
        exec(compile(code, where, "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"FAILED BLOCK {where}", file=sys.stderr)
        sys.exit(1)
"""


def run_python(page_blocks: list[Block], root: Path, timeout: float = 600
               ) -> subprocess.CompletedProcess:
    """Run one page's Python blocks in order in one fresh process."""
    payload = json.dumps([(b.where, b.code) for b in page_blocks])
    return subprocess.run([sys.executable, "-c", RUNNER], input=payload, cwd=root,
                          env=environment(root), capture_output=True, text=True, timeout=timeout)


def run_shell(block: Block, root: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.code], cwd=root,
                          env=environment(root), capture_output=True, text=True, timeout=timeout)
