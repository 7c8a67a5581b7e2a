"""The search on its own (no git, no compile): an oracle stands for the measurements.

Commits are indices: 0 is good, ``n`` is bad. Each test drives :class:`Search` the way
the engine does: ask for the next commit, record what the oracle says of it."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from gatekeeper.bisect.search import Conclusion, Search, bound


def run(n: int, oracle, hints=None) -> tuple[Search, Conclusion]:
    search = Search(n, dict(hints or {}))
    while (i := search.next()) is not None:
        assert 0 < i <= n and i not in search.measured, "measured twice or out of range"
        search.record(i, oracle(i))
    return search, search.conclusion()


@pytest.mark.parametrize("n", range(1, 40))
def test_a_clean_step_is_found_within_the_bound_wherever_it_is(n: int):
    for step in range(1, n + 1):
        search, found = run(n, lambda i, s=step: "bad" if i >= s else "good")
        assert found == Conclusion("found", culprit=step, last_good=step - 1)
        assert len(search.order) <= 1 + math.ceil(math.log2(n)) <= bound(n)
        assert search.order[0] == n  # bad first: does the change reproduce?


def test_the_bound_is_the_issues():
    assert [bound(n) for n in (1, 2, 8, 9, 32, 33)] == [2, 3, 5, 6, 7, 8]


@pytest.mark.parametrize("n", range(1, 11))
def test_any_metric_ends_on_a_real_step(n: int):
    """Non-monotonic: every good/bad pattern (bad at n). The culprit is bad and the
    commit before it good, as measured: a step that is there, never a made-up one."""
    for pattern in itertools.product(("good", "bad"), repeat=n - 1):
        truth = ["good", *pattern, "bad"]
        search, found = run(n, lambda i, t=truth: t[i])
        assert found.status == "found"
        c = found.culprit
        assert c is not None and truth[c] == "bad" and truth[c - 1] == "good"
        assert c - 1 == 0 or search.measured[c - 1] == "good"
        assert len(search.order) <= bound(n)


def test_bad_like_good_is_not_reproducible_after_one_measurement():
    for said in ("good", "undecided", "skip"):
        search, found = run(9, lambda i, s=said: s)
        assert found.status == "not-reproducible" and found.culprit is None
        assert search.order == [9]


def test_a_skipped_commit_is_stepped_around():
    """git bisect skip: the next commit nearest the middle is measured instead."""
    truth = {i: "good" if i < 8 else "bad" for i in range(1, 10)}
    truth[6] = "skip"
    search, found = run(9, lambda i: truth[i])
    assert found == Conclusion("found", culprit=8, last_good=7)
    assert search.order == [9, 4, 6, 7, 8]
    assert len([i for i in search.order if truth[i] != "skip"]) <= bound(9)


def test_a_skipped_neighbour_of_the_step_leaves_it_ambiguous():
    truth = {i: "good" if i < 5 else "bad" for i in range(1, 10)}
    truth[4] = "skip"  # the last good one cannot be built
    _, found = run(9, lambda i: truth[i])
    assert found.status == "ambiguous" and found.culprit is None
    assert found.candidates == (4, 5) and found.last_good == 3


def test_undecided_commits_are_said_not_guessed():
    truth = {i: "good" if i < 5 else "bad" for i in range(1, 10)}
    truth[5] = "undecided"
    _, found = run(9, lambda i: truth[i])
    assert found == Conclusion("ambiguous", candidates=(5, 6), last_good=4)


def test_right_hints_save_measurements_and_both_ends_are_confirmed():
    truth = ["good"] * 30 + ["bad"] * 3  # n = 32, the step at 30
    hints = {i: "good" for i in range(1, 28)} | {31: "bad"}
    search, found = run(32, lambda i: truth[i], hints)
    assert found == Conclusion("found", culprit=30, last_good=29)
    plain, _ = run(32, lambda i: truth[i])
    assert len(search.order) < len(plain.order)
    assert 27 in search.order or 29 in search.order  # the hinted good end was measured


def test_wrong_hints_cost_measurements_never_the_answer():
    rng = random.Random(3)
    for _ in range(300):
        n = rng.randint(2, 40)
        step = rng.randint(1, n)
        hints = {i: rng.choice(("good", "bad")) for i in rng.sample(range(1, n), k=min(n - 1, 4))}
        _, found = run(n, lambda i, s=step: "bad" if i >= s else "good", hints)
        assert found == Conclusion("found", culprit=step, last_good=step - 1), (n, step, hints)


def test_hints_that_would_cost_more_than_they_save_are_dropped():
    # both ends hinted, two candidates left: confirming them costs what halving saves
    assert Search(4, {1: "good", 3: "bad"}).hints == {}
    assert Search(4, {3: "good", 9: "bad", 0: "bad"}).hints == {3: "good"}  # in range only
    assert Search(32, {29: "good", 31: "bad"}).hints == {29: "good", 31: "bad"}


def test_a_range_needs_a_commit():
    with pytest.raises(ValueError):
        Search(0)
