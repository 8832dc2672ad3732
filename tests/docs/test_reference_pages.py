"""The reference pages are what ``scripts/generate_reference.py`` writes from the code: the
API from the public names, every config field, the recipe and stage tables, the errors of
the tests' catalogues, and the README's recipe table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.core.test_bad_inputs import CATALOGUE
from tests.cli.test_cli import CLI_ERRORS
from tests.support.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
generator = load_script("generate_reference")
CHEAP = [path for path in generator.pages() if path != "docs/reference/errors.md"]
ERRORS_PAGE = REPO / "docs" / "reference" / "errors.md"


@pytest.mark.parametrize("path", CHEAP)
def test_page_is_the_generators_output(path):
    assert (REPO / path).read_text() == generator.pages()[path](), (
        f"{path} is out of date: run python scripts/generate_reference.py")


def test_every_public_name_has_an_api_entry():
    import lightning_adv
    import lightning_adv.trainer as trainer

    api = "".join((REPO / "docs" / "reference" / "api").joinpath(p).read_text()
                  for p in ("advantage.md", "loss.md", "trainer.md", "errors.md"))
    documented = set(re.findall(r"^::: [\w.]+\.(\w+)$", api, re.M))
    public = {n for n in lightning_adv.__all__ if n != "__version__"} | set(trainer.__all__)
    assert public <= documented, public - documented


def test_every_config_field_is_on_the_config_page():
    import dataclasses

    page = (REPO / "docs" / "reference" / "config.md").read_text()
    for keys, cls in generator.config_sections():
        section = page.split(f"## {cls.__name__} {{ #{cls.__name__.lower()} }}")[1].split("\n## ")[0]
        for field in dataclasses.fields(cls):
            assert f"| `{field.name}` |" in section, (cls.__name__, field.name)


def committed_rows(section: str) -> dict[str, str]:
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `([\w-]+)` \|.*$", section, re.M)}


def error_sections() -> tuple[str, str]:
    text = ERRORS_PAGE.read_text()
    core, cli = text.split("\n## The command line\n")
    return core, cli


def test_errors_page_lists_every_catalogue_entry_in_order():
    core, cli = error_sections()
    assert list(committed_rows(core)) == [b.id for b in CATALOGUE]
    assert list(committed_rows(cli)) == [b.id for b in CLI_ERRORS]


def test_errors_page_shows_what_each_pipeline_case_raises():
    """The page is the generator's output up to the command-line rows, which
    tests/cli/test_cli.py checks as it runs those cases."""
    text = ERRORS_PAGE.read_text()
    head = generator.errors_page(generator.bad_input_rows(), [])
    assert text.startswith(head), ("docs/reference/errors.md is out of date: run "
                                   "python scripts/generate_reference.py")
    assert len(committed_rows(text[len(head):])) == len(CLI_ERRORS)
