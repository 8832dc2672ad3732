"""The package's shape: layers that only import downwards, no import cycle, files and
functions of a readable size, imports without side effects, deprecated names that warn."""

from __future__ import annotations

import ast
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "lightning_adv"

#: Each module's layer, by the longest matching prefix; a module may import only modules
#: of its own layer or below. (The docs' architecture page draws the same table.)
LAYERS = {
    "lightning_adv.exceptions": 0, "lightning_adv._checks": 0, "lightning_adv.dotted_path": 0,
    "lightning_adv.distributed": 0,
    # the one registry mechanism (stages and policy losses each keep one)
    "lightning_adv.registry": 0,
    "lightning_adv.ops": 1, "lightning_adv.batch.grouping": 1,
    "lightning_adv.stages.registry": 2, "lightning_adv.config": 2,
    "lightning_adv.stages": 3, "lightning_adv.batch": 3,
    "lightning_adv.advantage": 4,
    "lightning_adv.losses": 5, "lightning_adv.metrics": 5,
    "lightning_adv.recipes": 6, "lightning_adv.testing": 6, "lightning_adv.visualize": 6,
    # adapters for verl and TRL: built on the library's layers, never on the trainer
    "lightning_adv.integrations": 6,
    "lightning_adv.trainer": 7,
    "lightning_adv.cli": 8, "lightning_adv.__main__": 8, "lightning_adv": 8,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    match = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[match]


def runtime_imports(path: Path) -> set[str]:
    """The package modules ``path`` imports when it runs (``TYPE_CHECKING`` blocks left
    out; function-level imports included)."""
    tree = ast.parse(path.read_text())
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    names = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    return {n for n in names if n in modules}


def import_graph() -> dict[str, set[str]]:
    return {module_name(p): runtime_imports(p) - {module_name(p)}
            for p in PACKAGE.rglob("*.py")}


#: Inside the trainer (layer 7), each sub-package's floor, bottom up: what a run is made of,
#: then what drives it. A trainer module imports only trainer modules of its own floor or
#: below. (The architecture page's trainer table shows the same floors.)
TRAINER_FLOORS = {
    "lightning_adv.trainer.policies.config": 0, "lightning_adv.trainer.tasks": 0,
    "lightning_adv.trainer.data": 0,
    "lightning_adv.trainer.config": 1, "lightning_adv.trainer.rollout_config": 1,
    "lightning_adv.trainer.policies": 2,
    "lightning_adv.trainer.run": 3,
    "lightning_adv.trainer.rollout": 4,
    "lightning_adv.trainer.update": 5, "lightning_adv.trainer.logs": 5,
    "lightning_adv.trainer.setup": 6,
    "lightning_adv.trainer.ppo": 7,
    "lightning_adv.trainer": 8,
}


def trainer_floor(module: str) -> int:
    match = max((p for p in TRAINER_FLOORS if module == p or module.startswith(p + ".")), key=len)
    return TRAINER_FLOORS[match]


def test_inside_the_trainer_every_import_goes_down_or_sideways_a_floor():
    graph = import_graph()
    upward = [(m, d) for m, deps in graph.items() if m.startswith("lightning_adv.trainer.")
              for d in deps if d.startswith("lightning_adv.trainer.")
              and not d.startswith(m + ".") and trainer_floor(d) > trainer_floor(m)]
    assert not upward, f"trainer imports that go up a floor: {upward}"


def test_no_trainer_sub_package_holds_more_than_ten_modules():
    trainer = PACKAGE / "trainer"
    for folder in [trainer, *(p for p in trainer.rglob("*") if p.is_dir() and p.name != "__pycache__")]:
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        assert len(modules) <= 10, (folder, sorted(p.name for p in modules))


def test_every_import_goes_down_or_sideways_a_layer():
    upward = [(m, d) for m, deps in import_graph().items() for d in deps
              if m != "lightning_adv" and not d.startswith(m + ".") and layer(d) > layer(m)]
    assert not upward, f"imports that go up a layer: {upward}"


def test_there_is_no_import_cycle():
    graph = import_graph()
    # A package's __init__ re-exporting its own modules is not a cycle with them.
    graph = {m: {d for d in deps if not (d.startswith(m + ".") or m.startswith(d + ".") and
                                         d in graph and _is_package(d))}
             for m, deps in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in graph.get(node, ()):
            if state.get(dep) == 1:
                raise AssertionError(f"import cycle: {' -> '.join(stack[stack.index(dep):] + [dep])}")
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node)


def _is_package(module: str) -> bool:
    return (PACKAGE.parent / module.replace(".", "/") / "__init__.py").exists()


def test_files_and_functions_stay_small():
    too_long_files, too_long_functions = [], []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if text.count("\n") > 400:
            too_long_files.append(f"{path.relative_to(PACKAGE)} ({text.count(chr(10))} lines)")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 60:
                    too_long_functions.append(f"{path.relative_to(PACKAGE)}:{node.name} ({length})")
    assert not too_long_files and not too_long_functions, (too_long_files, too_long_functions)


#: The functions allowed more than 7 parameters, and why: public keyword APIs that mirror a
#: peer's calling convention (verl, TRL) or the YAML config tree, and the one custom op whose
#: schema is flat. Every entry must still exist and still exceed 7: the list only shrinks.
MANY_PARAMETERS = {
    "losses/ppo_loss.py:PPOLoss.__init__": "verl/TRL keyword style, one keyword per setting "
                                           "(its positional order is recorded public API)",
    "losses/ppo_loss.py:PPOLoss.forward": "verl/TRL keyword style, one keyword per [B, T] input",
    "integrations/verl.py:_estimator.estimate": "verl's estimator registry calls it with "
                                                "verl's keywords",
    "integrations/verl.py:actor_config_for": "public: verl's call-time keywords over its AlgoConfig",
    "losses/rollout_correction.py:rollout_correction": "verl's rollout_correction config keys",
    "stages/registry.py:register_stage": "public: one keyword per stage fact",
    "visualize/heatmap.py:advantage_heatmap": "public keyword API",
    "integrations/response_batch.py:response_advantages": "the verl/TRL adapters' keyword API",
    "trainer/ppo.py:PPOModule.__init__": "keyword-only, one per section of the YAML model: tree",
    "trainer/policies/hf/make_tiny.py:make_tiny": "public keywords mirroring make-tiny's flags "
                                                  "(write_tiny takes TinyModelOptions)",
    "ops/gae.py:turn_gae": "a torch.library op's schema: flat tensors and scalars",
    "ops/gae.py:_turn_gae_fake": "the op's fake implementation takes the op's arguments",
}


def parameter_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Parameters but ``self``/``cls``; ``*args`` and ``**kwargs`` count one each (a
    keyword-only configuration object is one)."""
    args = fn.args
    named = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    return (len([n for n in named if n not in ("self", "cls")])
            + (args.vararg is not None) + (args.kwarg is not None))


def functions(node: ast.AST, prefix: str = ""):
    """``(dotted name inside the module, node)`` of every function, methods and nested
    functions included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if not isinstance(child, ast.ClassDef):
                yield prefix + child.name, child
            yield from functions(child, f"{prefix}{child.name}.")
        else:
            yield from functions(child, prefix)


def test_no_function_takes_more_than_seven_parameters():
    counts = {f"{path.relative_to(PACKAGE).as_posix()}:{name}": parameter_count(fn)
              for path in PACKAGE.rglob("*.py")
              for name, fn in functions(ast.parse(path.read_text()))}
    too_many = {name: n for name, n in counts.items() if n > 7 and name not in MANY_PARAMETERS}
    assert not too_many, ("put state that belongs together in a small frozen dataclass "
                          f"(see docs/design/architecture.md, Choices): {too_many}")
    stale = {name: counts.get(name) for name in MANY_PARAMETERS if counts.get(name, 0) <= 7}
    assert not stale, f"allowed more than 7 parameters, but gone or now 7 or fewer: {stale}"


def run_python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True, timeout=120).stdout


def test_importing_the_config_loads_no_kernel_and_no_stage_implementation():
    loaded = run_python("import sys, lightning_adv.config\n"
                        "print(' '.join(m for m in sys.modules if m.startswith('lightning_adv')))"
                        ).split()
    assert "lightning_adv.config" in loaded
    for heavy in ("lightning_adv.ops.gae", "lightning_adv.stages.estimators",
                  "lightning_adv.stages.outcome", "lightning_adv.advantage.module"):
        assert heavy not in loaded, loaded


def test_importing_the_package_changes_no_environment_variable_and_loads_no_trainer():
    out = run_python("import os, sys; before = dict(os.environ); import lightning_adv\n"
                     "from lightning_adv import AdvantageModule, PPOLoss, AdvantageMetrics\n"
                     "print(dict(os.environ) == before, 'lightning.pytorch' in sys.modules)")
    assert out.split() == ["True", "False"]


@pytest.mark.parametrize("old, new", [
    ("TrajBatchMeta", "BatchMeta"), ("GAELambdaInputs", "GAELambdaContext"),
    ("SingletonGroupWarning", None), ("DroppedOutcomeRewardWarning", None)])
def test_old_names_still_work_and_warn(old, new):
    import lightning_adv
    from lightning_adv import exceptions

    with pytest.warns(DeprecationWarning, match=f"lightning_adv.{old} is deprecated"):
        value = getattr(lightning_adv, old)
    assert value is (getattr(lightning_adv, new) if new else getattr(exceptions, old))


def test_the_public_names_resolve():
    import lightning_adv

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of them is deprecated
        for name in lightning_adv.__all__:
            assert getattr(lightning_adv, name) is not None, name
    assert lightning_adv.__version__.count(".") == 2


def test_every_moved_trainer_module_still_imports_under_its_old_path_and_warns():
    """The trainer's modules of 0.2 (before its sub-packages) import for one release, each
    as the very module at its new path, with a DeprecationWarning naming it; a fresh
    process, so the old name is looked up, not found in sys.modules."""
    from lightning_adv.trainer._moved import MOVED

    code = ("import importlib, warnings\n"
            "from lightning_adv.trainer._moved import MOVED\n"
            "bad = []\n"
            "for old, new in MOVED.items():\n"
            "    with warnings.catch_warnings(record=True) as seen:\n"
            "        warnings.simplefilter('always')\n"
            "        module = importlib.import_module('lightning_adv.trainer.' + old)\n"
            "    target = importlib.import_module('lightning_adv.trainer.' + new)\n"
            "    said = [str(w.message) for w in seen if w.category is DeprecationWarning]\n"
            "    if module is not target or module.__spec__.name != target.__name__ or not any(\n"
            "            'import lightning_adv.trainer.' + new in s for s in said):\n"
            "        bad.append(old)\n"
            "print(len(MOVED), bad)")
    assert run_python(code).strip() == f"{len(MOVED)} []"
    assert len(MOVED) >= 25 and not (set(MOVED) & {"tasks", "rollout"})  # (packages now)
