"""A measured number in the guides, getting-started and design pages, ``docs/index.md`` and
the README is quoted from a generated page under ``docs/benchmarks/``, never typed from a
run nobody can find again (CONTRIBUTING.md, "Numbers in the docs").

What counts as measured, precisely enough to have no false positives: in prose and in
``text`` blocks (a run's output shown on the page), not in other code blocks, code spans,
HTML comments, link targets or the sections between a generator's ``<!-- name:begin -->``
and ``<!-- name:end -->`` markers (their own tests check those),

- a decimal with three or more digits after the point (a reward: ``0.972``),
- a duration (a number followed by ``ms``, ``s``, ``sec``, ``seconds``, ``min``,
  ``minutes``, ``h`` or ``hours``),
- a percentage (``1.4%``).

Each must appear as a number on some ``docs/benchmarks/*.md`` page, or be listed in
:data:`DERIVED` with what it is computed from. Settings and exact values stay in code
spans (`` `kl_ctl` 0.01 `` has two digits; an exact value such as ``A_0(call) = +0.066``
is code)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted([*DOCS.glob("guides/*.md"), *DOCS.glob("getting-started/*.md"),
                *DOCS.glob("design/*.md"), DOCS / "index.md", ROOT / "README.md"])

#: (page, the number as written) -> where it comes from: numbers computed from a
#: benchmark page's numbers rather than copied from it.
DERIVED: dict[tuple[str, str], str] = {}

FENCE = re.compile(r"^( *)(```|~~~)([^\n]*)\n(.*?)^\1\2[ \t]*$", re.M | re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
GENERATED = re.compile(r"<!-- ([\w-]+):begin -->.*?<!-- \1:end -->", re.S)
SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK_TARGET = re.compile(r"\]\([^)]*\)")
NUMBER = r"(?<![\w.:/#])[+−-]?\d[\d,]*(?:\.\d+)?"
MEASURED = re.compile(
    rf"(?P<decimal>(?<![\w.:/#])[+−-]?\d+\.\d{{3,}}(?![\w.]))"
    rf"|(?P<time>{NUMBER} ?(?:ms|s|sec|seconds?|min|minutes?|h|hours?)\b)"
    rf"|(?P<percent>{NUMBER} ?%)")


def prose(text: str) -> str:
    """``text`` without what the test does not read (generated sections first: their
    markers are comments)."""
    text = GENERATED.sub(" ", text)
    text = FENCE.sub(lambda m: m.group(4) if m.group(3).strip() == "text" else " ", text)
    for pattern in (COMMENT, SPAN, LINK_TARGET):
        text = pattern.sub(" ", text)
    return text


def value(quote: str) -> str:
    """The number of a quote: ``1m 05s`` is not one, ``78 s`` is ``78``."""
    return re.match(r"[+−-]?[\d,]*(?:\.\d+)?", quote).group(0).lstrip("+−-").replace(",", "")


def benchmark_numbers() -> set[str]:
    numbers = set()
    for page in DOCS.glob("benchmarks/*.md"):
        numbers.update(n.replace(",", "") for n in re.findall(r"\d[\d,]*(?:\.\d+)?",
                                                              page.read_text()))
    return numbers


def quotes(page: Path) -> list[str]:
    return [m.group(0).strip() for m in MEASURED.finditer(prose(page.read_text()))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_measured_numbers_come_from_a_benchmark_page(page):
    known = benchmark_numbers()
    name = str(page.relative_to(ROOT))
    unbacked = [q for q in quotes(page)
                if (name, q) not in DERIVED and value(q) not in known]
    assert not unbacked, (
        f"{name} quotes {unbacked}, which no docs/benchmarks/ page shows: quote a generated "
        "page (and link it), generate the table (CONTRIBUTING.md, 'Numbers in the docs'), "
        "or, for a number computed from a benchmark page's, add it to DERIVED with its source")


def test_the_check_sees_what_it_should():
    text = ("ends at 0.980 after 65 s, 12% of the step. `kl_ctl` 0.01, λ 0.95, `0.667`\n"
            "```\nreward 0.123\n```\n```text\nfinal 0.984\n```\n<!-- x:begin -->\n| 0.456 |\n<!-- x:end -->\n"
            "[page](a.md#0.999) 3 ms, arXiv:2505.10978")
    found = [m.group(0).strip() for m in MEASURED.finditer(prose(text))]
    assert found == ["0.980", "65 s", "12%", "0.984", "3 ms"]
    assert [value(q) for q in found] == ["0.980", "65", "12", "0.984", "3"]


def test_derived_entries_are_still_quoted():
    for (name, quote), _ in DERIVED.items():
        assert quote in quotes(ROOT / name), (name, quote, "no longer on the page: drop it")
