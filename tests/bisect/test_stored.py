"""Narrowing by stored baselines (no compile): baselines published into a real local
store for the commits of a range, read back as hints."""

from __future__ import annotations

from pathlib import Path

from support.factories import ENV, make_baseline, make_result

from gatekeeper.bisect.history import Commit
from gatekeeper.bisect.search import Search
from gatekeeper.bisect.stored import hints, stored_baselines
from gatekeeper.results import Noise, ReferenceOutputs
from gatekeeper.store import baselines as stored
from gatekeeper.store import open_store

TARGET = "net/b64/default"
COMMITS = [Commit(f"{i:02d}" * 20, f"c{i}", "t <t@t>", "2025-01-01") for i in range(10)]


def publish(store, i: int, *, compiled_s: float = 1e-3, sha: str = "a" * 64, ref: str = "main"):
    result = make_result(TARGET, seed=i, compiled_s=compiled_s, noise=0.002)
    result.reference = ReferenceOutputs(file="references/x.pt", sha256=sha, size=10)
    doc = make_baseline(result, ref=ref).model_copy(
        update={"commit": COMMITS[i].sha, "created_at": f"2025-01-01T00:00:{i:02d}Z"}
    )
    doc.noise = Noise(within=0.01, between=0.02, df=5, detectable=0.05)
    stored.publish(store, stored.BaselineKey(TARGET, ENV, ref), doc)


def test_a_slowdown_in_the_stored_history_narrows_the_search(tmp_path: Path):
    store = open_store(str(tmp_path / "store"))
    for i in (0, 2, 3, 5, 7, 9):
        publish(store, i, compiled_s=1e-3 if i < 6 else 1.5e-3)
    publish(store, 4, ref="feature")  # another branch's: not read
    found = stored_baselines(store, TARGET, ENV, "main", COMMITS)
    assert sorted(found) == [0, 2, 3, 5, 7, 9]
    said = hints("latency", found, 9)
    assert said == {2: "good", 3: "good", 5: "good", 7: "bad"}
    search = Search(9, said)
    assert search.hints == said  # (5, 7]: two candidates instead of nine


def test_latency_steps_within_the_drift_do_not_hint(tmp_path: Path):
    store = open_store(str(tmp_path / "store"))
    for i in (0, 4, 9):
        publish(store, i, compiled_s=1e-3 if i < 6 else 1.05e-3)  # 5%, drift 2%
    assert hints("latency", stored_baselines(store, TARGET, ENV, "main", COMMITS), 9) == {}


def test_parity_hints_by_identical_outputs(tmp_path: Path):
    store = open_store(str(tmp_path / "store"))
    for i, sha in ((0, "a"), (3, "a"), (5, "c"), (8, "b"), (9, "b")):
        publish(store, i, sha=sha * 64)
    said = hints("parity", stored_baselines(store, TARGET, ENV, "main", COMMITS), 9)
    assert said == {3: "good", 8: "bad"}  # 5's outputs are neither


def test_no_hints_without_both_ends(tmp_path: Path):
    store = open_store(str(tmp_path / "store"))
    for i in (0, 3, 5):
        publish(store, i)
    found = stored_baselines(store, TARGET, ENV, "main", COMMITS)
    assert hints("parity", found, 9) == {} and hints("latency", found, 9) == {}
    assert hints("compile", found, 9) == {}
