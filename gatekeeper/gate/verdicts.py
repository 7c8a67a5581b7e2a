"""The gate's verdicts: one closed set (:data:`gatekeeper.results.Verdict`, since a
published baseline records its verdict), in order of severity, and
:class:`TargetVerdict`, one target's verdict with its reasons and figures.

A target's verdict is the most severe that applies (:func:`worst`); a run's is its worst
target's. ``accepted`` is a ``regressed`` target the pull request accepts on purpose;
``no-baseline`` says there was nothing to compare with and nothing failed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, get_args

from ..config import GateConfig
from ..results import GraphBreak, TimingMode, Verdict
from . import stats
from .governing import Change, Source

__all__ = ["EXPLAINED", "FAILING", "ORDER", "TargetVerdict", "Verdict", "severity", "worst"]

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


@dataclass
class TargetVerdict:
    target: str
    verdict: Verdict
    reasons: list[str] = field(default_factory=list)  # why it is not a plain pass
    notes: list[str] = field(default_factory=list)  # worth saying, not failing
    latency: stats.Comparison | None = None  # the latency test
    speedup: stats.Comparison | None = None  # compiled/eager round ratios
    # the other timed metrics' comparisons by metric name (a generate target's TTFT,
    # TPOT and tokens/s: gate.generation), each in its metric's own direction
    timings: dict[str, stats.Comparison] = field(default_factory=dict)
    new_breaks: list[GraphBreak] = field(default_factory=list)
    borderline: bool = False  # a timing result to re-measure before believing it
    disturbed: str | None = None  # how disturbed the run was, when it was
    mode: TimingMode | None = None  # what decided the timing
    detectable: float | None = None  # smallest slowdown this run could tell from drift
    # the rules that judged it, and whose they are (gate.governing): the base's, so a
    # change cannot loosen its own gate; what the change alters of them and of the target
    rules: GateConfig | None = None
    rules_from: Source | None = None
    rule_changes: list[Change] = field(default_factory=list)
    definition_changes: list[Change] = field(default_factory=list)
    # a quantized target: its float twin's id, its p50 and weight bytes as ratios of the
    # twin's (gate.quantized)
    twin: dict[str, Any] | None = None

    def recompiled(self, found: set[Verdict], text: str, regress: bool) -> None:
        """New recompiles (``text`` names them and the guard that failed): a reason that
        regresses under ``recompiles = "no-increase"`` (``regress``), else a note."""
        if regress:
            found.add("regressed")
            self.reasons.append(text)
        else:
            self.notes.append(text)

    def to_dict(self) -> dict[str, Any]:
        """The verdict as plain JSON types (comparisons as dicts)."""
        d = dict(self.__dict__)
        d["latency"] = self.latency.to_dict() if self.latency else None
        d["speedup"] = self.speedup.to_dict() if self.speedup else None
        d["timings"] = {k: c.to_dict() for k, c in self.timings.items()}
        d["new_breaks"] = [b.model_dump() for b in self.new_breaks]
        d["rules"] = self.rules.model_dump(mode="json") if self.rules else None
        d["rule_changes"] = [c.to_dict() for c in self.rule_changes]
        d["definition_changes"] = [c.to_dict() for c in self.definition_changes]
        return d
