"""Detection power kept honest without timing anything: the gate's paired decision, at
the default config, on real paired samples recorded once and checked in
(tests/data/paired_samples.json; its ``note`` says the command, machine and commit).

The README and docs/statistics.md promise, for the default paired path: unchanged pull
requests flagged in at most 2% (0/100 measured) and a 10% slowdown `regressed` in at
least 95% (60/60 measured). ``benchmarks/detection_power.py`` measures that on a real
machine; this test keeps the *statistics and the defaults* that decide it honest in CI,
deterministically and in a second or two: each trial is a bootstrap of one recorded
trial's rounds (pairs drawn with replacement, a fixed seed), as many pairs as it had,
gated by :func:`gatekeeper.gate.rules.gate_target` with ``GateConfig()``; the 10% trials
are the same draws with the head's samples scaled by 1.10.

A change that weakens the test (a threshold default raised, an interval widened, the
signed-rank test's direction swapped) or makes it cry wolf (a threshold lowered to 0,
an interval narrowed to nothing) fails one of the two rates; CHANGELOG names the
mutations tried.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gatekeeper.config import GateConfig
from gatekeeper.gate import rules
from gatekeeper.gate.verdicts import TargetVerdict
from gatekeeper.results import Paired
from tests.support.factories import make_result

DATA = Path(__file__).resolve().parents[1] / "data" / "paired_samples.json"
TRIALS = 200  # bootstrap trials per level: 2% of them is 4
SEED = 42
# the documented figures (README "How often it is right", docs/statistics.md)
MAX_FALSE_ALARMS = 0.02
MIN_POWER_AT_10 = 0.95


def recorded() -> list[tuple[np.ndarray, np.ndarray]]:
    """The recorded unchanged trials: (base, head) compiled seconds, one pair a round."""
    doc = json.loads(DATA.read_text())
    runs = [(np.asarray(t["base"]), np.asarray(t["head"])) for t in doc["trials"]]
    assert runs and all(len(b) == len(h) >= 5 for b, h in runs)
    return runs


def draws(scale: float) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """TRIALS bootstraps of the recorded trials (in turn), the head's samples x scale;
    the same draws at every scale."""
    rng = np.random.default_rng(SEED)
    runs = recorded()
    for i in range(TRIALS):
        base, head = runs[i % len(runs)]
        pick = rng.integers(0, len(base), len(base))
        yield base[pick], head[pick] * scale


def verdicts(scale: float) -> list[TargetVerdict]:
    """The gate's verdict, default config, on each draw (a quiet run: not disturbed)."""
    out = []
    for base, head in draws(scale):
        r = make_result("knob/b32/default", n=len(head), others_cores=None)
        assert r.latency is not None and r.graphs is not None
        r.latency.samples["compiled"] = head.tolist()
        r.paired = Paired(
            base_ref="main",
            base_commit="a" * 40,
            code_hash="b0",
            compile_seconds=3.0,
            graphs=r.graphs,
            samples=base.tolist(),
        )
        out.append(rules.gate_target(r, None, GateConfig()))
    return out


def share(found: list[TargetVerdict], verdict: str) -> float:
    return sum(v.verdict == verdict for v in found) / len(found)


def tally(found: list[TargetVerdict]) -> dict[str, int]:
    return dict(Counter(v.verdict for v in found))


@pytest.fixture(scope="module")
def unchanged() -> list[TargetVerdict]:
    return verdicts(1.0)


@pytest.fixture(scope="module")
def slower() -> list[TargetVerdict]:
    return verdicts(1.10)


def test_the_recorded_samples_are_a_real_paired_run() -> None:
    """What the rates below stand on: several trials of real rounds, base and head
    within a few percent of each other (unchanged code), not constant."""
    doc = json.loads(DATA.read_text())
    assert {"command", "machine", "commit"} <= set(doc["note"])
    runs = recorded()
    assert len(runs) >= 8
    for base, head in runs:
        ratio = float(np.exp(np.mean(np.log(head / base))))
        assert 0.97 < ratio < 1.03, ratio
        assert np.std(np.log(head / base)) > 0


def test_unchanged_code_passes_at_the_documented_false_alarm_rate(
    unchanged: list[TargetVerdict],
) -> None:
    """Unchanged pull requests: `regressed` (or `improved`) in at most 2%, and `pass`
    in at least 98% (an `inconclusive` asks for another run: not a pass either)."""
    flagged = share(unchanged, "regressed") + share(unchanged, "improved")
    print(f"\nunchanged: {tally(unchanged)}")
    assert flagged <= MAX_FALSE_ALARMS, flagged
    assert share(unchanged, "pass") >= 1 - MAX_FALSE_ALARMS, unchanged


def test_a_ten_percent_slowdown_is_caught_at_the_documented_power(
    slower: list[TargetVerdict],
) -> None:
    """The head's samples x 1.10: `regressed` in at least 95% of the same draws, each
    by its latency."""
    print(f"\n+10%: {tally(slower)}")
    caught = [v for v in slower if v.verdict == "regressed"]
    assert len(caught) >= MIN_POWER_AT_10 * len(slower), tally(slower)
    assert all(any(r.startswith("latency +") for r in v.reasons) for v in caught)


def test_the_interval_the_gate_decides_on_is_a_95_percent_interval(
    unchanged: list[TargetVerdict],
) -> None:
    """The verdicts above hang on the paired 95% interval: on these draws it covers the
    recorded trial's own ratio (the truth the draws are made from) in about 95% of them.
    A widened interval (fewer slowdowns caught at a given noise) covers nearly always, a
    narrowed one (more false alarms) too seldom; either fails here."""
    runs = recorded()
    truth = [float(np.exp(np.mean(np.log(h / b)))) for b, h in runs]
    covered = [
        v.latency is not None and v.latency.ci_lo <= truth[i % len(runs)] <= v.latency.ci_hi
        for i, v in enumerate(unchanged)
    ]
    rate = sum(covered) / len(covered)
    print(f"\ncoverage: {rate:.1%}")
    assert 0.90 <= rate <= 0.985, rate
