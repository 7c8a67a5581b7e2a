"""The search: which commit to measure next, and what the measurements found. Pure:
no git, no store, no torch.

Commits are indices: 0 is good (known good: every measurement is paired with it), ``n``
is bad, ``1..n`` are the candidates. Each measured commit is ``good`` (like good),
``bad`` (changed like bad), ``skip`` (could not be measured: it does not build,
compile or export, or has no such model; ``git bisect skip``) or ``undecided`` (measured
again and still not told apart). Stored baselines may add *hints* (``good`` or ``bad``)
for commits not measured: they narrow the range, and the commits that end up bounding
the culprit are then measured to confirm them.

The bound: bad is measured first (does the change reproduce?); then each measurement
halves the candidates between the last good and the first bad, so a clean step takes at
most ``1 + ceil(log2(n))`` measurements, within the issue's ``ceil(log2(n)) + 2``
(:func:`bound`). Hints are used only when they cannot make it take more (both ends
confirmed); skipped and undecided commits cost one measurement each beyond the bound.
A non-monotonic metric (a change that comes, goes and comes back) still ends on a bad
commit whose nearest decided predecessor is good: a real step, as ``git bisect`` finds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

Outcome = Literal["good", "bad", "skip", "undecided"]
Hint = Literal["good", "bad"]
Status = Literal["found", "ambiguous", "not-reproducible"]


def bound(n: int) -> int:
    """The most commits a clean step measures among ``n`` candidates."""
    return math.ceil(math.log2(n)) + 2 if n > 0 else 0


def _halvings(candidates: int) -> int:
    return math.ceil(math.log2(candidates)) if candidates > 1 else 0


@dataclass(frozen=True)
class Conclusion:
    status: Status
    culprit: int | None = None  # found: the first bad commit
    candidates: tuple[int, ...] = ()  # ambiguous: any of these (skipped or undecided, and bad)
    last_good: int = 0  # the good commit before the culprit (or the candidates)


@dataclass
class Search:
    n: int
    hints: dict[int, Hint] = field(default_factory=dict)
    measured: dict[int, Outcome] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)  # indices, as measured

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError("a bisect needs at least one commit after good")
        self.hints = {i: h for i, h in self.hints.items() if 0 < i < self.n}
        if self.hints and self._hinted_cost() > _halvings(self.n):
            self.hints = {}  # they would not save a measurement

    def _hinted_cost(self) -> int:
        lo, hi = self._bounds(hints_only=True)
        return _halvings(hi - lo) + (hi != self.n) + (lo != 0)

    def _known(self, i: int, *, hints_only: bool = False) -> Hint | None:
        if i == 0:
            return "good"
        if hints_only:
            return "bad" if i == self.n else self.hints.get(i)
        got = self.measured.get(i)
        if got in ("good", "bad"):
            return got
        return self.hints.get(i) if got is None else None

    def _bounds(self, *, hints_only: bool = False) -> tuple[int, int]:
        """(last good, first bad after it): the first bad commit, and the last good one
        before it."""
        hi = next(
            (i for i in range(1, self.n + 1) if self._known(i, hints_only=hints_only) == "bad"),
            self.n,
        )
        lo = max(i for i in range(hi) if self._known(i, hints_only=hints_only) == "good")
        return lo, hi

    def record(self, i: int, outcome: Outcome) -> None:
        self.measured[i] = outcome
        self.order.append(i)

    def next(self) -> int | None:
        """The commit to measure next; None when the search has concluded."""
        if self.n not in self.measured:
            return self.n
        if self.measured[self.n] != "bad":
            return None
        lo, hi = self._bounds()
        middle = (lo + hi) / 2
        open_ = [i for i in range(lo + 1, hi) if i not in self.measured]
        if open_:
            return min(open_, key=lambda i: (abs(i - middle), i))
        for end in (hi, lo):  # a hinted end is confirmed before it is believed
            if end != 0 and end not in self.measured:
                return end
        return None

    def conclusion(self) -> Conclusion:
        if self.measured.get(self.n) != "bad":
            return Conclusion("not-reproducible")
        lo, hi = self._bounds()
        between = tuple(
            i for i in range(lo + 1, hi) if self.measured.get(i) in ("skip", "undecided")
        )
        if between:
            return Conclusion("ambiguous", candidates=(*between, hi), last_good=lo)
        return Conclusion("found", culprit=hi, last_good=lo)
