"""Judgement is a table of small rules (issue 43): the scorer's `evaluate` runs services/scorer/rules.py's
RULE_TABLE and judges nothing itself; every rule in it is a function of one shared signature, and every
rule function of the module is in it. A new subsystem is one more entry, and nothing grows long again:
no function of the scorer's rules or the remediator's decisions is over 80 lines."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import get_type_hints

import pytest

from services.scorer import rules
from tests.paths import REPO

MODULE = REPO / "services" / "scorer" / "rules.py"
# Every rule: (case: Case, verdicts: Verdicts) -> None.
SIGNATURE = {"case": rules.Case, "verdicts": dict[str, rules.Verdict], "return": type(None)}


def functions(path: Path) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_every_rule_in_the_table_has_the_shared_signature() -> None:
    assert rules.RULE_TABLE, "no rule judges"
    for rule in rules.RULE_TABLE:
        assert inspect.isfunction(rule), rule
        assert rule.__module__ == rules.__name__, f"{rule.__name__}: the rules live in one module"
        assert list(inspect.signature(rule).parameters) == ["case", "verdicts"], rule.__name__
        assert get_type_hints(rule) == SIGNATURE, rule.__name__


def test_every_rule_function_of_the_module_is_in_the_table() -> None:
    """A function of the rules' signature outside RULE_TABLE would be a rule that never judges, or one
    that evaluate calls by hand: both are the table bypassed."""
    table = {rule.__name__ for rule in rules.RULE_TABLE}
    for name, node in functions(MODULE).items():
        if [ast.unparse(a.annotation) for a in node.args.args if a.annotation] == ["Case", "Verdicts"]:
            assert name in table, f"{name} has a rule's signature but is not in RULE_TABLE"


def test_evaluate_is_short_and_judges_only_through_the_table() -> None:
    evaluate = functions(MODULE)["evaluate"]
    assert evaluate.end_lineno is not None
    assert evaluate.end_lineno - evaluate.lineno + 1 <= 40, "evaluate grew: put the judgement in a rule"
    loops = [n for n in ast.walk(evaluate) if isinstance(n, ast.For)]
    assert [ast.unparse(loop.iter) for loop in loops] == ["RULE_TABLE"], "evaluate runs the table, once"
    (loop,) = loops
    assert isinstance(loop.target, ast.Name)
    allowed = {"Verdict", "Case.of", loop.target.id}  # the empty verdicts, the case, and each rule
    called = {ast.unparse(n.func) for n in ast.walk(evaluate) if isinstance(n, ast.Call)}
    assert called <= allowed, f"evaluate judges outside the table: it calls {sorted(called - allowed)}"
    assert not [n for n in ast.walk(evaluate) if isinstance(n, ast.If | ast.IfExp | ast.Compare)], (
        "evaluate decides nothing itself: a condition belongs in a rule"
    )


@pytest.mark.parametrize(
    "path",
    ["services/scorer/rules.py", "services/remediator/decide.py", "services/remediator/repairs.py"],
)
def test_no_function_of_the_judgement_or_the_decisions_is_over_80_lines(path: str) -> None:
    tree = ast.parse((REPO / path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            assert lines <= 80, f"{path}: {node.name} is {lines} lines"
