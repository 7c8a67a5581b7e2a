"""Narrowing by what the store already holds: the branch's baselines (the dashboard's
history), one per measured push, each naming its commit.

A commit of the range with a stored baseline gets a *hint* when its stored figure sits
near good's (``good``) or near bad's (``bad``): within a quarter of the way between
them. Latency figures come from different processes, so they hint only when good and
bad stored are at least four drifts apart (the baseline's measured drift between runs,
else the gate's assumed one): a quarter of the way is then at least one drift. Parity
hints by identical reference outputs (sha256). Hints only narrow; the commits that end
up bounding the culprit are measured (:mod:`gatekeeper.bisect.search`).
"""

from __future__ import annotations

import math

from ..gate.drift import DEFAULT_DRIFT
from ..results import Baseline
from ..store import Store, baselines
from .history import Commit
from .metrics import Metric, position, stored_value
from .search import Hint

NEAR = 0.25  # of the way from good to bad
DRIFTS_APART = 4.0


def stored_baselines(
    store: Store, target_id: str, env_key: str, ref: str, commits: list[Commit]
) -> dict[int, Baseline]:
    """Index in ``commits`` -> the newest baseline of ``ref`` stored for that commit.
    Only history documents named after a commit of the range are read."""
    key = baselines.BaselineKey(target_id, env_key, ref)
    index = {c.sha[:12]: i for i, c in enumerate(commits)}
    newest: dict[int, str] = {}
    for info in store.list(f"{key.prefix}/history/"):
        parsed = baselines.parse_key(info.key)
        if parsed is None or parsed.kind != "history":
            continue
        i = index.get(parsed.name.removesuffix(".json").rpartition("-")[2])
        if i is not None and info.key > newest.get(i, ""):
            newest[i] = info.key
    found = {}
    for i, k in newest.items():
        doc = baselines.read_doc(store, k)
        if doc is not None and doc.commit == commits[i].sha:
            found[i] = doc
    return found


def hints(metric: Metric, stored: dict[int, Baseline], n: int) -> dict[int, Hint]:
    """Hints for the commits between good (0) and bad (``n``), from their baselines;
    none unless good and bad both have one that tells them apart."""
    if 0 not in stored or n not in stored:
        return {}
    values = {i: stored_value(metric, doc.result) for i, doc in stored.items()}
    good, bad = values[0], values[n]
    if good is None or bad is None or good == bad:
        return {}
    if metric == "parity":
        return {
            i: ("good" if v == good else "bad")
            for i, v in values.items()
            if 0 < i < n and v in (good, bad)
        }
    assert isinstance(good, float | int) and isinstance(bad, float | int)
    if metric == "latency":
        noise = stored[n].noise
        drift = (noise.between if noise else None) or DEFAULT_DRIFT
        if abs(math.log(bad / good)) < DRIFTS_APART * drift:
            return {}
    out: dict[int, Hint] = {}
    for i, v in values.items():
        if not 0 < i < n or not isinstance(v, float | int):
            continue
        at = position(metric, good, bad, v)
        if at is not None and abs(at) <= NEAR:
            out[i] = "good"
        elif at is not None and abs(at - 1) <= NEAR:
            out[i] = "bad"
    return out
