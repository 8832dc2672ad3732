"""The one registry mechanism: registration mistakes are errors naming the argument, and no
module outside the stages' and losses' own files lists their names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lightning_adv.losses.policy_loss_registry import (
    POLICY_LOSSES, register_policy_loss, unregister_policy_loss)
from lightning_adv.stages.registry import STAGES, register_stage, unregister_stage

PACKAGE = Path(__file__).resolve().parents[2] / "lightning_adv"


def test_a_bare_policy_loss_decorator_registers_the_function_itself():
    @register_policy_loss
    def bare_loss_for_test(inputs):
        return inputs.logprobs, {}
    try:
        assert bare_loss_for_test.__name__ == "bare_loss_for_test"  # not an inner closure
        assert POLICY_LOSSES["bare_loss_for_test"].fn is bare_loss_for_test
    finally:
        unregister_policy_loss("bare_loss_for_test")


@pytest.mark.parametrize("register", [register_policy_loss("mine"),
                                      register_stage("estimator", "mine")])
def test_decorating_something_not_a_function_names_what_was_given(register):
    with pytest.raises(TypeError, match=r"expected to decorate a function .*got 5 \(a int\)"):
        register(5)


@pytest.mark.parametrize("make", [lambda: register_policy_loss("a.b"),
                                  lambda: register_stage("estimator", "a.b")])
def test_a_dotted_name_that_could_never_be_selected_is_refused(make):
    with pytest.raises(ValueError, match=r"name: expected None .* import path.*got 'a\.b'"):
        make()


def test_a_bare_stage_decorator_names_the_missing_family():
    with pytest.raises(ValueError, match=r"register_stage family: expected one of .*got the "
                                         r"function my_stage"):
        @register_stage
        def my_stage(inputs):
            return inputs


def test_a_stage_fact_with_a_wrong_value_is_refused():
    with pytest.raises(ValueError, match=r"register_stage timestep_unit: expected one of"):
        register_stage("estimator", timestep_unit="step")
    with pytest.raises(ValueError, match=r"register_stage requires: expected a tuple"):
        register_stage("estimator", requires="sum_pi_squared")


def test_user_stages_and_builtins_share_one_registry():
    @register_stage("estimator", requires=("sum_pi_squared",))
    def needs_pi_for_test(inputs):
        return inputs
    try:
        entry = STAGES["estimator"]["needs_pi_for_test"]
        assert not entry.builtin and entry.requires == ("sum_pi_squared",)
        assert STAGES["estimator"]["token_gae"].builtin
        with pytest.raises(ValueError, match="already registered"):
            register_stage("estimator", "token_gae")(needs_pi_for_test)
    finally:
        unregister_stage("estimator", "needs_pi_for_test")
    with pytest.raises(ValueError, match="built-ins stay"):
        unregister_stage("estimator", "token_gae")


def test_the_old_tables_still_work_and_warn():  # removed as data, kept one release
    from lightning_adv.losses import policy_loss_registry
    from lightning_adv.stages import registry

    with pytest.warns(DeprecationWarning, match="BUILTIN_STAGES is deprecated"):
        table = registry.BUILTIN_STAGES
    assert table["estimator"]["token_gae"].fn.__name__ == "token_gae"
    with pytest.warns(DeprecationWarning, match="BUILTIN_POLICY_LOSSES is deprecated"):
        assert "vanilla" in policy_loss_registry.BUILTIN_POLICY_LOSSES


#: Where a built-in name may appear as a string: the recipe table (recipes are named
#: configs of stages: data) and verl's estimator names (recipe names verl also uses).
ALLOWED = {"config/recipe_table.py": None, "integrations/verl.py": {"VERL_ESTIMATORS"}}
#: Another concept's value that happens to equal a stage name: rollout correction's
#: ``loss_type: reinforce`` (verl's name for the -w A log pi loss).
OTHER_CONCEPTS = {("losses/rollout_correction.py", "reinforce"), ("losses/ppo_loss.py", "reinforce"),
                  # the ppo.vine config field and the random stream of its continuations
                  ("trainer/config.py", "vine"), ("trainer/logs/heatmap_log.py", "vine")}


def _defaults(tree: ast.AST) -> set[int]:
    """Ids of the constants that are a parameter's or a field's default value."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            ids.update(id(d) for d in node.args.defaults + node.args.kw_defaults if d is not None)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            ids.add(id(node.value))
    return ids


def test_no_module_outside_a_stage_or_loss_definition_lists_their_names():
    entries = [e for family in STAGES.values() for e in family.entries()]
    entries += list(POLICY_LOSSES.entries())
    defined: dict[str, set[str]] = {}
    for e in entries:
        if e.builtin:
            defined.setdefault(e.name, set()).add(e.fn.__module__)
    found = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        module = "lightning_adv." + rel[:-3].replace("/", ".")
        if rel in ALLOWED and ALLOWED[rel] is None:
            continue
        tree = ast.parse(path.read_text())
        skipped = _defaults(tree)
        for node in ast.walk(tree):  # the named tables ALLOWED lets a module keep
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id in (ALLOWED.get(rel) or ()) for t in node.targets):
                skipped.update(id(n) for n in ast.walk(node))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in defined and id(node) not in skipped \
                    and module not in defined[node.value] and (rel, node.value) not in OTHER_CONCEPTS:
                found.append(f"{rel}:{node.lineno} {node.value!r}")
    assert not found, f"stage or loss names outside their definitions: {found}"
