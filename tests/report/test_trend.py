"""report.trend.sparkline: the base branch's last baselines, and this PR's point."""

from __future__ import annotations

import doctest
import math

from gatekeeper.report import trend
from gatekeeper.report.trend import BARS, MARK, sparkline


def test_the_docstring_examples_hold() -> None:
    failed, tried = doctest.testmod(trend)
    assert tried >= 5 and failed == 0


def test_one_bar_per_run_and_the_pr_after_the_mark() -> None:
    line = sparkline([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], 4.5)
    history, pr = line.split(MARK)
    assert history == BARS
    assert pr in BARS and len(pr) == 1


def test_the_pr_shares_the_scale_of_the_history() -> None:
    # a PR far beyond the history takes the top, and squeezes the history down
    assert sparkline([1.0, 1.01, 1.02], 2.0) == f"▁▁▁{MARK}█"
    assert sparkline([1.0, 1.01, 1.02], 0.5).endswith(f"{MARK}▁")
    assert sparkline([1.0, 2.0], 1.0) == f"▁█{MARK}▁"


def test_flat_history_and_no_pr() -> None:
    assert sparkline([3.0, 3.0], 3.0) == f"▄▄{MARK}▄"
    assert sparkline([1.0, 2.0], None) == "▁█"
    assert MARK not in sparkline([1.0], None)


def test_no_history_no_trend() -> None:
    assert sparkline([], None) == ""
    assert sparkline([], 1.0) == ""


def test_non_finite_values_leave_gaps() -> None:
    assert sparkline([1.0, math.nan, math.inf, 2.0], None) == "▁  █"
    assert sparkline([1.0, 2.0], math.nan) == f"▁█{MARK} "
    assert sparkline([math.nan], None) == " "
