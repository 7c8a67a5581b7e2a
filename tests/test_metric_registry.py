"""The metric registry (gatekeeper/metrics.py) is the one home of a metric: a toy metric
registered here, and nothing else edited, is gated, reported (markdown and JSON),
charted by the dashboard and bisectable. Driven through the CLI over a real local store
holding published baselines and a results.json, as CI runs them.

The toy is the FX graph count (``Graphs.count``), which the worker already returns for
both sides (``Paired.graphs``) but no metric reads."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.factories import RULES, make_baseline, make_result, make_results

from gatekeeper import cli, metrics
from gatekeeper.bisect.metrics import (
    classify,
    default_threshold,
    names,
    position,
    stored_value,
)
from gatekeeper.bisect.stored import hints
from gatekeeper.config import GateConfig
from gatekeeper.gate import rules
from gatekeeper.gate.baseline import publish_result
from gatekeeper.results import Paired, ParityCheck, TargetResult, Work
from gatekeeper.store import open_store
from gatekeeper.store.baselines import BaselineKey, history

TARGET = "net/b64/default"
CONFIG = """
[tool.gatekeeper]
store = "store"

[[tool.gatekeeper.models]]
name = "net"
factory = "tinymodel:make"
inputs = [{ shape = ["batch", 256] }]
shapes = [{ batch = 64 }]
"""
TOY = metrics.Metric(
    "fx-graphs",
    "FX graphs",
    lambda r: r.graphs.count if r.graphs else None,
    lambda pair: pair.graphs.count,
    threshold="work_regression",
    column="FX graphs",
    chart=metrics.Chart("fx-graphs", "FX graphs", "graphs Dynamo compiled", "graphs"),
    bisect=True,
)


@pytest.fixture
def toy() -> Iterator[metrics.Metric]:
    metrics.register(TOY)
    yield TOY
    metrics.unregister(TOY.name)


@pytest.fixture(autouse=True)
def _no_github(monkeypatch) -> None:
    for name in ("GITHUB_REPOSITORY", "GITHUB_SERVER_URL", "GITHUB_BASE_REF", "GITHUB_ACTIONS"):
        monkeypatch.delenv(name, raising=False)


def graphs(r: TargetResult, count: int) -> TargetResult:
    assert r.graphs is not None
    r.graphs = r.graphs.model_copy(update={"count": count})
    return r


def project(tmp_path: Path, base_graphs: list[int], pr_graphs: int) -> Path:
    """A project whose store holds main's baselines (one per count, oldest first) and a
    results.json of a pull request whose target compiles ``pr_graphs`` graphs (every
    other figure as the last baseline's)."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "pyproject.toml").write_text(CONFIG)
    store = open_store(str(root / "store"))
    for i, count in enumerate(base_graphs):
        r = graphs(make_result(TARGET, seed=1), count)
        r.measured_at = f"2025-01-0{i + 1}T00:00:00Z"
        assert publish_result(store, r, ref="main", commit=f"{i + 1:040x}") == "published"
    pr = graphs(make_result(TARGET, seed=1), pr_graphs)
    doc = make_results([pr])
    (root / "results.json").write_text(doc.dump())
    return root


def gate(root: Path, capsys, monkeypatch) -> tuple[int, dict, str]:
    monkeypatch.chdir(root)
    code = cli.main(["gate", "--results", "results.json", "--base-ref", "main", "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out), (root / "report.md").read_text()


def test_a_registered_metric_is_gated_and_reported(tmp_path, toy, capsys, monkeypatch):
    root = project(tmp_path, [2], 4)
    code, doc, md = gate(root, capsys, monkeypatch)
    (t,) = doc["targets"]
    assert code == 1 and t["verdict"] == "regressed"
    assert t["reasons"] == ["FX graphs 2 -> 4 (+100.0% vs the baseline, threshold 5%)"]
    assert t["fx-graphs"] == {"base": 2, "pr": 4}
    saved = json.loads((root / "report.json").read_text())
    assert saved["targets"][0]["fx-graphs"] == {"base": 2, "pr": 4}
    header = next(ln for ln in md.splitlines() if ln.startswith("| target "))
    row = next(ln for ln in md.splitlines() if ln.startswith(f"| {TARGET} "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert cells[columns.index("FX graphs")] == "2 → 4"
    assert "FX graphs 2 -&gt; 4" in md


def test_fewer_of_it_is_a_note_and_unregistered_it_is_nowhere(tmp_path, capsys, monkeypatch):
    root = project(tmp_path, [4], 2)
    code, doc, md = gate(root, capsys, monkeypatch)  # not registered: not a metric
    assert code == 0 and "fx-graphs" not in doc["targets"][0] and "FX graphs" not in md
    metrics.register(TOY)
    try:
        code, doc, md = gate(root, capsys, monkeypatch)
    finally:
        metrics.unregister(TOY.name)
    assert code == 0 and "FX graphs 4 -> 2 (-50.0%)" in doc["targets"][0]["notes"]


def test_a_registered_metric_is_charted(tmp_path, toy, capsys, monkeypatch):
    root = project(tmp_path, [2, 3, 5], 5)
    monkeypatch.chdir(root)
    code = cli.main(["dashboard", "--store", "store", "--out", "site", "--json"])
    pages = json.loads(capsys.readouterr().out)["pages"]
    assert code == 0
    page = next(root / "site" / p for p in pages if p != "index.html")
    m = re.search(r'id="gk-data">(.*?)</script>', page.read_text(), re.S)
    assert m
    (chart,) = [c for c in json.loads(m.group(1))["charts"] if c["id"] == "fx-graphs"]
    assert chart["title"] == "FX graphs" and chart["unit"] == "graphs"
    assert chart["series"][0]["values"] == [2.0, 3.0, 5.0]


def test_a_registered_metric_is_bisectable(tmp_path, toy, capsys):
    assert "fx-graphs" in names()
    args = cli.build_parser().parse_args(
        ["bisect", "--good", "a", "--bad", "b", "--metric", TOY.name]
    )
    assert args.metric == TOY.name
    # a commit measured paired with good: the base's count measured beside its own
    head = graphs(make_result(TARGET, seed=1), 6)
    head.paired = Paired(
        base_ref="good",
        base_commit="a" * 40,
        code_hash="b0",
        compile_seconds=3.0,
        graphs=graphs(make_result(TARGET, seed=2), 3).graphs,
        samples=head.latency.samples["compiled"] if head.latency else [],
    )
    threshold = default_threshold(TOY.name, RULES)
    assert threshold == RULES.work_regression
    figure = classify(TOY.name, head, None, RULES, threshold, None)
    assert not isinstance(figure, str)
    assert figure.outcome == "bad" and figure.text == "FX graphs 3 -> 6 (+100.0%)"
    # the store's baselines of the commits between narrow the range by the metric
    root = project(tmp_path, [2, 2, 8, 8], 8)
    docs = history(open_store(str(root / "store")), BaselineKey(TARGET, head.env_key, "main"), 9)
    assert [stored_value(TOY.name, d.result) for d in docs] == [2.0, 2.0, 8.0, 8.0]
    assert hints(TOY.name, dict(enumerate(docs)), 3) == {1: "good", 2: "bad"}


def test_unregistered_bisect_refuses_the_metric(capsys):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(
            ["bisect", "--good", "a", "--bad", "b", "--metric", "fx-graphs"]
        )
    assert e.value.code == 2 and "invalid choice: 'fx-graphs'" in capsys.readouterr().err


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="already registered"):
        metrics.register(metrics.get("flops"))
    with pytest.raises(ValueError, match="already registered"):
        metrics.register(metrics.Metric("work", "work", lambda r: None))  # a group's name
    with pytest.raises(ValueError, match="built in"):
        metrics.unregister("latency")


def test_a_baseline_without_the_figure_is_not_compared(toy):
    """A baseline published before the metric existed says nothing of it."""
    base = make_baseline(make_result(TARGET, seed=1))
    base.result.graphs = None
    v = rules.gate_target(graphs(make_result(TARGET, seed=2), 9), base, RULES)
    assert not any("FX graphs" in x for x in v.reasons + v.notes)


# -- a metric in decibels, higher is better, with a floor: SQNR's shape -----------------


class QuantRules(GateConfig):
    """The settings such a metric adds to the gate's (as config.GateConfig would)."""

    sqnr_regression: float = 1.0  # dB below the base's
    sqnr_floor: float = 20.0  # dB, whatever the base


def _db(r: TargetResult) -> float | None:
    """A stand-in SQNR read off a result: the compiled outputs' error in dB below 1."""
    err = r.parity.vs_eager.max_abs_err if r.parity else None
    return -20 * math.log10(err) if err else None


SQNR = metrics.Metric(
    "toy-sqnr",
    "SQNR",
    _db,
    fmt=lambda x: "–" if x is None else f"{x:.1f} dB",
    unit="dB",
    better="higher",
    threshold="sqnr_regression",
    relative=False,
    bound="sqnr_floor",
    column="SQNR",
    bisect=True,
)


def at_db(db: float, seed: int) -> TargetResult:
    r = make_result(TARGET, seed=seed)
    assert r.parity is not None
    check = ParityCheck(passed=True, method="allclose", max_abs_err=10 ** (-db / 20))
    r.parity = r.parity.model_copy(update={"vs_eager": check})
    return r


@pytest.mark.parametrize(
    ("base", "pr", "verdict", "said"),
    [
        (
            30.0,
            28.0,
            "regressed",
            "SQNR 30.0 dB -> 28.0 dB (-2 dB vs the baseline, threshold 1 dB)",
        ),
        (30.0, 29.5, "pass", None),
        (30.0, 35.0, "pass", "SQNR 30.0 dB -> 35.0 dB (+5 dB)"),
        (19.5, 19.0, "regressed", "SQNR 19.0 dB is below sqnr_floor = 20.0 dB"),
    ],
)
def test_a_metric_in_db_with_a_floor_fits_the_descriptor(base, pr, verdict, said):
    metrics.register(SQNR)
    try:
        v = rules.gate_target(at_db(pr, 2), make_baseline(at_db(base, 1)), QuantRules())
        stored = stored_value(SQNR.name, at_db(25.0, 3))
        at = position(SQNR.name, 20.0, 30.0, 25.0)  # an amount: linear, not log
    finally:
        metrics.unregister(SQNR.name)
    assert v.verdict == verdict
    if said is not None:
        assert said in v.reasons + v.notes
    else:
        assert not any("SQNR" in x for x in v.reasons + v.notes)
    assert stored == pytest.approx(25.0) and at == pytest.approx(0.5)


def test_every_work_counter_the_worker_returns_is_one_registered_metric():
    """One list: the gate gated 2 counters and the dashboard charted 4 from two copies.
    Every field of results.Work is a metric of the work group; FLOPs and bytes accessed
    are gated, kernels and instructions shown and charted only."""
    work = metrics.group("work")
    assert [m.name for m in work] == list(Work.model_fields)
    assert [m.name for m in work if m.threshold] == ["flops", "bytes_accessed"]
    assert all(m.chart is not None and m.heading for m in work)
    base = make_baseline(make_result(TARGET, seed=1, work=Work(flops=100, kernels=3)))
    more = make_result(TARGET, seed=2, work=Work(flops=100, kernels=30))
    v = rules.gate_target(more, base, RULES)
    assert not any("kernels" in x for x in v.reasons + v.notes)
