"""The trainer's layer keeps the house rules: no file of ``lightning_adv/trainer`` (nor
``cli.py``) over 400 lines, no function over 60 lines, and no import cycle among the
trainer's modules (function-level imports included)."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAINER = REPO / "lightning_adv" / "trainer"
FILES = sorted(TRAINER.glob("*.py")) + [REPO / "lightning_adv" / "cli.py"]


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every ``lightning_adv...`` module the file imports, at any level of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_file_over_400_lines_and_no_function_over_60():
    long_files = {p.name: n for p in FILES if (n := len(p.read_text().splitlines())) > 400}
    assert not long_files
    long_functions = []
    for path in FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                if node.end_lineno - start + 1 > 60:
                    long_functions.append(f"{path.name}:{node.lineno} {node.name}")
    assert not long_functions


def test_the_trainer_modules_import_each_other_without_a_cycle():
    modules = {module_name(p): p for p in sorted(TRAINER.glob("*.py"))}
    edges = {name: imported_modules(path) & modules.keys() - {name}
             for name, path in modules.items()}
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, "import cycle: " + " -> ".join(path[path.index(name):] + (name,))
        if name in done:
            return
        for target in sorted(edges[name]):
            visit(target, path + (name,))
        done.add(name)

    for name in modules:
        visit(name, ())
