"""The architecture page tells the truth about the layers: its table puts every module
where ``tests/core/test_layers.py`` (which checks every import) puts it, and its picture
is drawn from that table."""

import re
from pathlib import Path

from tests.core.test_layers import LAYERS, layer

REPO = Path(__file__).resolve().parents[2]
PAGE = (REPO / "docs" / "design" / "architecture.md").read_text()


def table_rows() -> dict[int, list[str]]:
    """Layer number -> the modules the page's table names in that row."""
    rows = {}
    for line in PAGE.split("Inside `trainer/`")[0].splitlines():  # (the package's table)
        match = re.match(r"^\| (\d) \| (.*?) \|", line)
        if match:
            paths = re.findall(r"`([\w/.]+)`", match.group(2))
            rows[int(match.group(1))] = [
                "lightning_adv." + p.removesuffix("/").removesuffix(".py").replace("/", ".")
                for p in paths]
    return rows


def test_the_table_puts_each_module_in_its_layer():
    rows = table_rows()
    assert sorted(rows) == sorted(set(LAYERS.values()))
    for rank, modules in rows.items():
        for module in modules:
            assert layer(module) == rank, (module, rank, layer(module))


def test_every_layer_of_the_test_is_on_the_page():
    rows = table_rows()
    named = {m for modules in rows.values() for m in modules}
    for prefix, rank in LAYERS.items():
        if prefix == "lightning_adv":
            continue
        assert any(m == prefix or m.startswith(prefix + ".") for m in rows[rank]), (prefix, rank)
    assert named


def test_the_picture_is_the_scripts():
    assert "../images/layers.png" in PAGE and (REPO / "docs" / "images" / "layers.png").is_file()


def test_the_trainer_table_puts_each_sub_package_on_its_floor():
    from tests.core.test_layers import TRAINER_FLOORS, trainer_floor

    rows = {}
    for line in PAGE.split("| floor | modules")[1].split("\n\n")[0].splitlines():
        match = re.match(r"^\| (\d) \| (.*?) \|", line)
        if match:
            rows[int(match.group(1))] = [
                "lightning_adv." + p.removesuffix("/").removesuffix(".py").replace("/", ".")
                for p in re.findall(r"`(trainer/[\w/.]*)`", match.group(2))]
    assert sorted(rows) == sorted(set(TRAINER_FLOORS.values()) - {max(TRAINER_FLOORS.values())})
    for floor, modules in rows.items():
        assert modules and all(trainer_floor(m) == floor for m in modules), (floor, modules)


def test_every_path_where_new_things_go_exists():
    """The "where new things go" tables of this page and of CONTRIBUTING.md name files and
    folders that exist."""
    contributing = (REPO / "CONTRIBUTING.md").read_text()
    named = set()
    for text in (PAGE, contributing):
        table = text.split("## Where new things go")[1].split("\n## ")[0]
        # paths with a folder in them; the page's are under lightning_adv/, or the repository's
        named.update(p for p in re.findall(r"`([\w/.-]+/[\w/.-]*)`", table) if "<" not in p)
    assert len(named) > 15
    missing = [p for p in named
               if not (REPO / p).exists() and not (REPO / "lightning_adv" / p).exists()]
    assert not missing, missing
