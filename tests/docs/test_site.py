"""The documentation site builds with ``mkdocs build --strict`` (no warning: every page in
the navigation, every link and anchor resolved, every API entry found), and the built
pages show what the reader came for."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.peers import require_extra

REPO = Path(__file__).resolve().parents[2]

# the docs extra: skips without it, fails where CI requires it (tests/support/peers.py)
require_extra("mkdocs")
require_extra("mkdocstrings")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(REPO)}
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                            str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    assert "WARNING" not in build.stderr, build.stderr[-4000:]
    return out


def test_every_markdown_page_is_built(site):
    pages = {p.relative_to(REPO / "docs").with_suffix(".html") for p in (REPO / "docs").rglob("*.md")}
    built = {p.relative_to(site) for p in site.rglob("*.html")}
    assert pages <= built, pages - built


def test_api_pages_render_the_docstrings(site):
    loss = (site / "reference" / "api" / "loss.html").read_text()
    for text in ("PPOLoss", "clip_eps_high", "AdaptiveKLController", "AdvantageMetrics"):
        assert text in loss, text
    for page in (site / "reference" / "api").glob("*.html"):
        html = page.read_text()
        assert not re.search(r":(class|func|meth|mod):`", html), f"{page.name}: a raw reST role"


def test_pictures_are_in_the_site(site):
    for name in ("layers.png", "tensorboard.png", "seed_curves.png", "hf_reward_curves.png"):
        assert (site / "images" / name).stat().st_size > 10_000, name
