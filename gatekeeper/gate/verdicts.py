"""The gate's verdicts: one closed set (:data:`gatekeeper.results.Verdict`, since a
published baseline records its verdict), in order of severity.

A target's verdict is the most severe that applies (:func:`worst`); a run's is its worst
target's. ``accepted`` is a ``regressed`` target the pull request accepts on purpose;
``no-baseline`` says there was nothing to compare with and nothing failed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import get_args

from ..results import Verdict

__all__ = ["EXPLAINED", "FAILING", "ORDER", "Verdict", "severity", "worst"]

#: every verdict, most severe first
ORDER: tuple[Verdict, ...] = get_args(Verdict)
#: the verdicts that fail a run (exit code 1, or 2 for ``error``)
FAILING: tuple[Verdict, ...] = ("error", "parity-failed", "regressed")
#: the verdicts the report explains under its table: what failed, and what still needs
#: a decision
EXPLAINED: tuple[Verdict, ...] = (*FAILING, "inconclusive", "accepted")


def severity(verdict: Verdict) -> int:
    """0 for the most severe (``error``) up to ``no-baseline``."""
    return ORDER.index(verdict)


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """The most severe of ``verdicts`` (at least one)."""
    return min(verdicts, key=severity)
