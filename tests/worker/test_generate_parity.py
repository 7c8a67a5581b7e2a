"""Parity by tokens (gatekeeper/worker/generate_parity.py) on generations made up here:
the same tokens pass; a first divergence that is a near-tie (each run's token among the
other's top-k, the scores within the tolerance) passes and is said; a divergence beyond
the tolerance, or a token outside the other's top-k, fails naming the step, the prompt
and both tokens; the prefill's logits go up the ladder first."""

from __future__ import annotations

import torch

from gatekeeper.config import ParityTolerance
from gatekeeper.worker.generate_parity import Generated, check, token_check

TOL = ParityTolerance()
NAMES = ("compiled", "eager")


def generated(tokens: list[list[int]], scores: list[list[dict[int, float]]]) -> Generated:
    """Prompts x steps of one row: each step's chosen token and its top scores."""
    k = 3
    idx = torch.tensor([[[list(s)[:k] for s in steps]] for steps in scores])
    val = torch.tensor([[[list(s.values())[:k] for s in steps]] for steps in scores])
    logits = torch.zeros(len(tokens), 1, 8)
    return Generated(torch.tensor([[t] for t in tokens]), idx, val, logits)


STEP = {5: 2.0, 6: 1.0, 7: 0.5}


def test_the_same_tokens_pass():
    a = generated([[5, 5], [5, 5]], [[STEP, STEP], [STEP, STEP]])
    same, said = token_check(a, a, TOL, NAMES)
    assert same and said == "the same 1x2 greedy tokens from 2 prompt(s)"


def test_a_near_tie_passes_and_is_said():
    tie_a = {5: 2.0, 6: 2.0 - 1e-6, 7: 0.5}
    tie_b = {6: 2.0, 5: 2.0 - 1e-6, 7: 0.5}
    a = generated([[5, 5]], [[STEP, tie_a]])
    b = generated([[5, 6]], [[STEP, tie_b]])
    same, said = token_check(a, b, TOL, NAMES)
    assert same, said
    assert said.startswith("near-tie at token 2 of prompt 1: compiled 5, eager 6 (scores ")
    result = check(a, b, TOL, NAMES)
    assert result["passed"] and result["detail"].startswith("tokens: near-tie at token 2")


def test_a_divergence_beyond_the_tolerance_fails_naming_the_step_and_both_tokens():
    a = generated([[5, 5, 5]], [[STEP, STEP, {5: 2.0, 6: 1.9, 7: 0.5}]])
    b = generated([[5, 5, 6]], [[STEP, STEP, {6: 2.0, 5: 1.9, 7: 0.5}]])
    result = check(a, b, TOL, NAMES)
    assert not result["passed"] and result["method"] == "tokens"
    assert result["detail"] == "token 3 of prompt 1: compiled 5, eager 6 (scores 0.1 apart)"


def test_a_token_outside_the_other_runs_top_k_fails():
    a = generated([[5]], [[{5: 2.0, 6: 1.0, 7: 0.5}]])
    b = generated([[3]], [[{3: 2.0, 6: 1.0, 7: 0.5}]])
    same, said = token_check(a, b, TOL, NAMES)
    assert not same and said.startswith("token 1 of prompt 1: compiled 5, eager 3 (")
    assert "not in the other run's top-k" in said


def test_the_prefill_logits_go_up_the_ladder_first():
    a = generated([[5]], [[STEP]])
    b = generated([[5]], [[STEP]])
    b.logits = b.logits + 1.0
    result = check(a, b, TOL, NAMES)
    assert not result["passed"] and "prefill_logits" in result["detail"]


def test_reference_outputs_read_back():
    a = generated([[5, 6]], [[STEP, STEP]])
    back = Generated.read(a.outputs())
    assert back is not None and torch.equal(back.tokens, a.tokens)
