"""One bisect, start to end: for each target, narrow the range by the stored baselines,
measure until the search concludes, then measure the culprit against its parent (the
effect of that one commit, and the gate's report of it with the profile diff)."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..gate.rules import build_report
from ..progress import Progress
from ..report import write_report
from ..store import Store
from .history import Commit, Range, worktrees
from .measure import Measurement, Measurer, ScratchStore
from .metrics import Metric
from .search import Conclusion, Hint, Search, bound
from .stored import hints, stored_baselines


@dataclass
class TargetBisect:
    target: str
    metric: Metric
    range: Range
    steps: list[Measurement] = field(default_factory=list)
    conclusion: Conclusion = Conclusion("not-reproducible")
    stored: list[int] = field(default_factory=list)  # commits with a stored baseline
    hints: dict[int, Hint] = field(default_factory=dict)  # the hints the search used
    confirm: Measurement | None = None  # the culprit against its parent
    confirm_report: Path | None = None
    config_flag: str = ""  # `--config PATH` for the reproducing command, when given

    @property
    def culprit(self) -> Commit | None:
        c = self.conclusion.culprit
        return self.range.commits[c] if c is not None else None

    @property
    def parent(self) -> Commit | None:
        c = self.conclusion.culprit
        return self.range.commits[c - 1] if c is not None else None

    def reproduce(self) -> str | None:
        culprit, parent = self.culprit, self.parent
        if culprit is None or parent is None:
            return None
        return (
            f"git checkout {culprit.sha} && gatekeeper run --base-ref {parent.sha} "
            f"--target {shlex.quote(self.target)}{self.config_flag}"
        )

    def tested(self) -> list[Measurement]:
        return [m for m in self.steps if m.outcome != "skip"]

    def skipped(self) -> list[Measurement]:
        return [m for m in self.steps if m.outcome == "skip"]

    def bad_step(self) -> Measurement | None:
        return next((m for m in self.steps if m.index == self.range.size), None)

    def effect(self) -> dict | None:
        if self.conclusion.status != "found":
            return None
        vs_good = next(m for m in self.steps if m.index == self.conclusion.culprit)
        vs_parent = self.confirm
        return {
            "metric": self.metric,
            "against": "parent",
            **(vs_parent.figure.as_dict() if vs_parent and vs_parent.figure else {}),
            "confirmed": bool(vs_parent and vs_parent.outcome == "bad"),
            "vs_good": vs_good.figure.as_dict() if vs_good.figure else None,
        }

    @property
    def found(self) -> bool:
        return self.conclusion.status == "found"

    def as_dict(self) -> dict:
        commits = self.range.commits
        lo = self.conclusion.last_good
        culprit = self.culprit
        return {
            "target": self.target,
            "metric": self.metric,
            "status": self.conclusion.status,
            "culprit": {
                **culprit.as_dict(),
                "index": self.conclusion.culprit,
                "parent": self.parent.sha if self.parent else None,
            }
            if culprit
            else None,
            "candidates": [commits[i].as_dict() for i in self.conclusion.candidates],
            "effect": self.effect(),
            "tested": [m.as_dict() for m in self.tested()],
            "skipped": [m.as_dict() for m in self.skipped()],
            "range": {
                **self.range.as_dict(),
                "bound": bound(self.range.size),
                "last_good": commits[lo].sha,
                "stored_baselines": [commits[i].sha for i in self.stored],
                "hints": {commits[i].sha: h for i, h in sorted(self.hints.items())},
            },
            "reproduce": self.reproduce(),
            "culprit_report": str(self.confirm_report) if self.confirm_report else None,
        }


def run(
    *,
    root: Path,
    rng: Range,
    config_path: str,
    targets: list[str],
    metric: Metric,
    threshold: float | None,
    store: Store,
    out: Path,
    base_ref: str,
    config_flag: str = "",
    verbose: bool = False,
) -> list[TargetBisect]:
    """Bisect every target in turn, sharing worktrees and the scratch store."""
    scratch = ScratchStore.over(store, out / "store")
    with worktrees(root, out / "worktrees") as trees:
        measurer = Measurer(
            trees, config_path, scratch, out, metric, threshold, base_ref, verbose=verbose
        )
        done = []
        for target_id in targets:
            tb = TargetBisect(target_id, metric, rng, config_flag=config_flag)
            _narrow(tb, store, measurer, base_ref)
            _search(tb, measurer)
            _confirm(tb, measurer)
            done.append(tb)
    return done


def _narrow(tb: TargetBisect, store: Store, measurer: Measurer, base_ref: str) -> None:
    """The stored baselines of the range's commits, and the hints they give."""
    env_key = measurer.env_key(tb.range.good, tb.target)
    found = stored_baselines(store, tb.target, env_key, base_ref, tb.range.commits)
    tb.stored = sorted(found)
    tb.hints = hints(tb.metric, found, tb.range.size)


def _search(tb: TargetBisect, measurer: Measurer) -> None:
    rng = tb.range
    measurer.prepare(rng.good, tb.target)
    search = Search(rng.size, tb.hints)
    tb.hints = dict(search.hints)  # what it kept
    sys.stderr.write(
        f"gatekeeper: bisect {tb.target} ({tb.metric}): {rng.size} commits after "
        f"{rng.good.short}, at most {bound(rng.size)} to measure"
        + (f"; {len(tb.hints)} narrowed by stored baselines" if tb.hints else "")
        + "\n"
    )
    progress = Progress(bound(rng.size))
    direction: int | None = None
    while (i := search.next()) is not None:
        commit = rng.commits[i]
        with progress.step(f"{commit.short} {commit.subject[:48]}", "measuring") as step:
            m = measurer.measure(commit, i, tb.target, base=rng.good, direction=direction)
            step.done(f"{m.outcome}: {m.figure.text}" if m.figure else f"skipped: {m.why}")
        if m.outcome in ("skip", "undecided"):
            progress.total += 1  # beyond the bound: said, not hidden
        if i == rng.size and m.figure is not None:
            direction = m.figure.direction
        search.record(i, m.outcome)
        tb.steps.append(m)
    tb.conclusion = search.conclusion()


def _confirm(tb: TargetBisect, measurer: Measurer) -> None:
    """The culprit paired with its parent: the effect of that commit alone, and the
    gate's report of it (its profile diff included)."""
    culprit, parent = tb.culprit, tb.parent
    if culprit is None or parent is None:
        return
    index = tb.conclusion.culprit
    assert index is not None
    bad = tb.bad_step()
    direction = bad.figure.direction if bad and bad.figure else None
    if index == 1:  # its parent is good: measured so already
        tb.confirm = next(m for m in tb.steps if m.index == index)
    else:
        sys.stderr.write(f"gatekeeper: bisect {tb.target}: the culprit against its parent\n")
        tb.confirm = measurer.measure(
            culprit, index, tb.target, base=parent, direction=direction, folder="culprit-vs-parent"
        )
    m = tb.confirm
    if m.result is None or m.results is None:
        return
    got = measurer.target(culprit, tb.target)
    if isinstance(got, str):
        return
    config, target = got
    report = build_report(
        [m.result], {}, lambda _: config.gate_for(target.model), base_ref=parent.short
    )
    report.profile_all = True
    report.mode_reason = f"paired with its parent {parent.short} in one process"
    tb.confirm_report = m.results.parent / "report.md"
    write_report(report, tb.confirm_report)
