"""Measuring one commit for ``bisect``: check it out, build its bundle, and measure it
paired with the base commit through the gate's own machinery
(:func:`gatekeeper.check.run.check_all` in paired mode), then say what the metric did.

* The commit's own config (the same path as the user's, in its worktree) and its own
  model code; the commit is skipped, with why, when it has no such config or target,
  or its model does not build, compile or export (``git bisect skip``).
* Bundles: a commit's bundle in the store warm-starts it; otherwise it is compiled
  seeded from the bundle of the nearest commit in the range that has one (its
  neighbour: most likely the same graphs, which then hit), and kept in a scratch store
  under ``--out`` (:mod:`gatekeeper.store.overlay`) for the measurements after it. The
  store itself is only read.
* An undecided latency is measured again, at most :data:`AGAIN` more times: a
  borderline one pooled with the new rounds (as ``run`` re-measures), a disturbed one
  replaced by them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..check.paired import Mode
from ..check.run import Plan, check_all
from ..compile import compile_target
from ..config import Config
from ..errors import ConfigError, StoreError, UsageError
from ..gate.drift import disturbance, merge_latency
from ..key import target_key
from ..project import expand, load_config
from ..results import Results, TargetResult, write_results
from ..store import BundleLocation, Store
from ..store.base import store_error
from ..store.local import LocalBackend
from ..store.overlay import OverlayBackend
from ..targets import Target
from .history import Commit, Worktrees
from .metrics import Figure, Metric, alone, classify, default_threshold
from .search import Outcome

log = logging.getLogger("gatekeeper.bisect")

AGAIN = 2  # more measurements of an undecided commit
QUICK_MIN_TIME = 0.5  # seconds of timed rounds where latency is not the metric


@dataclass
class Measurement:
    """One commit measured (or skipped) for one target."""

    commit: Commit
    index: int
    outcome: Outcome
    figure: Figure | None = None
    why: str | None = None  # skipped: why
    attempts: int = 0
    results: Path | None = None  # the results.json of its (last) measurement
    result: TargetResult | None = field(default=None, repr=False)

    def as_dict(self) -> dict:
        return {
            "index": self.index,
            **self.commit.as_dict(),
            "outcome": self.outcome,
            **({"figure": self.figure.as_dict()} if self.figure else {}),
            **({"why": self.why} if self.why else {}),
            "attempts": self.attempts,
            "results": str(self.results) if self.results else None,
        }


@dataclass
class ScratchStore(Store):
    """The scratch store over the user's, listing the bundles of the commits nearest the
    one compiled next first: the compile path seeds from the first bundle it finds
    that is not this code's (:func:`gatekeeper.key.find_bundle`), else the newest."""

    prefer: list[str] = field(default_factory=list)  # code hashes, the nearest first

    @classmethod
    def over(cls, store: Store, folder: Path) -> ScratchStore:
        return cls(OverlayBackend(LocalBackend(folder), store.backend))

    def manifests(self, target_id: str, env_key: str) -> list[BundleLocation]:
        rank = {h: n for n, h in enumerate(self.prefer)}
        found = super().manifests(target_id, env_key)
        return sorted(found, key=lambda loc: rank.get(loc.code_hash, len(rank)))


def slug(target_id: str) -> str:
    return target_id.replace("/", "__")


def for_bisect(config: Config, metric: Metric) -> Config:
    """A commit's config as bisect measures it: no precompile packages (nothing here is
    deployed), no shape sweep, and short timed rounds unless latency is the metric."""
    measure: dict[str, object] = {"shape_sweep": False}
    if metric != "latency":
        measure["min_time"] = min(config.measure.min_time, QUICK_MIN_TIME)
    return config.model_copy(
        update={
            "precompile": "off",
            "models": [m.model_copy(update={"precompile": "off"}) for m in config.models],
            "measure": config.measure.model_copy(update=measure),
        }
    )


@dataclass
class Measurer:
    trees: Worktrees
    config_path: str  # the config, relative to the repository's root
    store: ScratchStore  # over the user's
    out: Path
    metric: Metric
    threshold: float | None
    base_ref: str  # whose stored baselines check reads (paired mode measures beside)
    verbose: bool = False
    references: dict[tuple[str, str], TargetResult] = field(default_factory=dict)
    built: dict[tuple[int, str], str] = field(default_factory=dict)  # (index, target): code

    def target(self, commit: Commit, target_id: str) -> tuple[Config, Target] | str:
        """The commit's config and target, or why it has none."""
        path = self.trees.of(commit.sha) / self.config_path
        if not path.is_file():
            return f"no {self.config_path} at this commit"
        try:
            config = for_bisect(load_config(path), self.metric)
            found = [t for t in expand(config) if t.id == target_id]
        except ConfigError as e:
            return f"its config: {e}"
        return (config, found[0]) if found else f"no target {target_id} at this commit"

    def env_key(self, commit: Commit, target_id: str) -> str:
        got = self.target(commit, target_id)
        if isinstance(got, str):
            raise UsageError(f"--good {commit.short}: {got}")
        return target_key(got[1], got[0].base_dir).env_key

    def prepare(self, good: Commit, target_id: str) -> None:
        """The good commit's bundle (every measurement pairs with it), and for memory and
        compile time its own measurement; a good commit that cannot be measured is an
        error (exit 2)."""
        if self.metric != "compile":
            why = self._build(good, 0, target_id)
            if why:
                raise UsageError(f"--good {good.short}: {why}")
        self.reference(good, target_id)

    def reference(self, commit: Commit, target_id: str) -> TargetResult | None:
        """``commit`` measured on its own (memory, compile time), once."""
        if not alone(self.metric):
            return None
        if (commit.sha, target_id) not in self.references:
            got = self.target(commit, target_id)
            if isinstance(got, str):
                raise UsageError(f"{commit.short}: {got}")
            config, target = got
            out_dir = self.out / slug(target_id) / "alone" / commit.short
            results = self._check(config, target, out_dir, Mode("stored", "measured alone"))
            r = results.targets[0]
            if r.status != "ok":
                raise UsageError(f"{commit.short} measured alone: {r.error}")
            self.references[(commit.sha, target_id)] = r
        return self.references[(commit.sha, target_id)]

    def _build(self, commit: Commit, index: int, target_id: str) -> str | None:
        """The commit's bundle, compiled into the scratch store unless one is there;
        why not, when it cannot be built."""
        got = self.target(commit, target_id)
        if isinstance(got, str):
            return got
        config, target = got
        near = sorted(
            (abs(i - index), code) for (i, t), code in self.built.items() if t == target_id
        )
        self.store.prefer = [code for _, code in near]
        built = compile_target(target, config, self.store, verbose=self.verbose)
        if built.code_hash:
            self.built[(index, target_id)] = built.code_hash
        if built.error_kind == "store":
            raise store_error(self.store.uri, StoreError(built.error or "failed"), target_id)
        if built.status == "not-exportable":
            return f"not exportable: {built.error}"
        if built.status == "error":
            return f"does not build or compile: {built.error}"
        return None

    def _check(self, config: Config, target: Target, out_dir: Path, mode: Mode) -> Results:
        cold = self.metric == "compile"  # a cold compile is the figure
        plan = Plan(out_dir, self.base_ref, mode, cold=cold, verbose=self.verbose)
        results = check_all([target], config, self.store, plan)
        write_results(results, out_dir)
        return results

    def measure(
        self,
        commit: Commit,
        index: int,
        target_id: str,
        *,
        base: Commit,
        direction: int | None,
        folder: str = "commits",
    ) -> Measurement:
        """``commit`` paired with ``base``, measured again while undecided (bounded)."""
        m = Measurement(commit, index, "skip")
        if self.metric != "compile" and (why := self._build(commit, index, target_id)):
            m.why = why
            return m
        got = self.target(commit, target_id)
        if isinstance(got, str):
            m.why = got
            return m
        config, target = got
        mode = Mode("paired", f"paired with {base.short}", base.sha, base.sha)
        result: TargetResult | None = None
        while m.attempts <= AGAIN and (m.figure is None or m.figure.again):
            m.attempts += 1
            out_dir = self.out / slug(target_id) / folder / commit.short / str(m.attempts)
            again = self._check(config, target, out_dir, mode).targets[0]
            if again.status != "ok":
                if result is None:
                    m.why = f"{'not exportable' if again.status != 'error' else 'failed'}: "
                    m.why += str(again.error)
                    return m
                break  # keep what the earlier measurement said
            result = _pool(result, again)
            m.results, m.result = out_dir / "results.json", result
            gate = config.gate_for(target.model)
            threshold = self.threshold
            if threshold is None:
                threshold = default_threshold(self.metric, gate)
            said = classify(
                self.metric, result, self.reference(base, target_id), gate, threshold, direction
            )
            if isinstance(said, str):
                m.why = said
                return m
            m.figure = said
        assert m.figure is not None
        m.outcome = m.figure.outcome
        return m


def _pool(first: TargetResult | None, again: TargetResult) -> TargetResult:
    """Another measurement of an undecided commit: a disturbed one is replaced, a
    borderline one gets the new rounds added (the pairs stay pairs)."""
    if first is None or first.latency is None or again.latency is None:
        return again
    if disturbance(first) is not None:
        return again
    pooled = first.model_copy(deep=True)
    pooled.latency = merge_latency(first.latency, again.latency)
    if pooled.paired is not None and again.paired is not None:
        pooled.paired.samples += again.paired.samples
    return pooled
