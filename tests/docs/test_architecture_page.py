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
    for line in PAGE.splitlines():
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
