"""The runner's expression subset follows GitHub's rules, and no run: script takes an
input except through env (tests/support/action_runner.py plays the runner)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from support.action_runner import ACTION, ROOT, Expr, ExprError, condition, render


def test_expression_subset_follows_github_rules() -> None:
    ctx = {
        "inputs": {"comment": "true", "fail-on-regression": "False"},
        "steps": {"gk": {"outputs": {"report": "/tmp/r.md", "cache-hit": "true"}}},
        "github": {"event_name": "pull_request"},
    }
    fns = {
        "success": lambda: True,
        "failure": lambda: False,
        "always": lambda: True,
        "cancelled": lambda: False,
    }

    def ev(text: str) -> Any:
        return Expr.evaluate(text, ctx, fns)

    assert ev("inputs.comment == 'true'") is True
    assert ev("inputs.fail-on-regression == 'false'") is True  # strings ignore case
    assert ev("steps.gk.outputs.report != ''") is True
    assert ev("steps.gk.outputs.missing != ''") is False  # null coerces like ''
    assert ev("steps.nope.outputs.x") is None
    assert ev("steps.gk.outputs.cache-hit") == "true"
    assert ev("!(github.event_name == 'push') && 'a' || 'b'") == "a"
    assert ev("'it''s'") == "it's"
    assert ev("1 == '1'") is True and ev("null == 0") is True
    assert condition("inputs.comment == 'true'", ctx, {**fns, "success": lambda: False}) is False
    assert (
        condition(
            "${{ always() && inputs.comment == 'true' }}", ctx, {**fns, "success": lambda: False}
        )
        is True
    )
    assert render("a ${{ inputs.comment }} b ${{ null }}", ctx, fns) == "a true b "
    with pytest.raises(ExprError):
        ev("contains(inputs.comment, 't')")  # not in the subset: refused, not guessed
    with pytest.raises(ExprError):
        ev("secrets.TOKEN")


def test_run_scripts_take_inputs_only_through_env() -> None:
    """No ``${{ }}`` inside a ``run:`` (in the action and in the example workflows): an
    input or event field can never become shell code."""
    docs = {ACTION: yaml.safe_load(ACTION.read_text())}
    docs |= {p: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "workflows").glob("*.yml"))}
    scripts = 0
    for path, doc in docs.items():
        steps = (
            doc["runs"]["steps"]
            if path == ACTION
            else [s for job in doc["jobs"].values() for s in job.get("steps", [])]
        )
        for step in steps:
            if "run" in step:
                scripts += 1
                assert "${{" not in step["run"], f"{path.name}: {step.get('name')}"
    assert scripts >= 8
