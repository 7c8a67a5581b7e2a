"""``gatekeeper dashboard`` without a browser: what it reads from the store, the chart
data and pages it writes, its links, its JSON and its errors."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import get_args

import pytest
from support.factories import ENV, make_baseline, make_result

from gatekeeper.cli import main
from gatekeeper.dashboard import build
from gatekeeper.dashboard.data import charts, commit_url, metrics
from gatekeeper.results import Baseline, Memory, Work
from gatekeeper.store import open_store
from gatekeeper.store.baselines import BaselineKey

TARGET = "resnet-tiny/b8/max-autotune"


@pytest.fixture(autouse=True)
def _no_github(monkeypatch) -> None:
    for name in ("GITHUB_REPOSITORY", "GITHUB_SERVER_URL"):
        monkeypatch.delenv(name, raising=False)


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["dashboard", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def page_json(page: Path) -> dict:
    m = re.search(r'id="gk-data">(.*?)</script>', page.read_text(), re.S)
    assert m
    return json.loads(m.group(1))


def test_json_lists_pages_targets_and_points(tmp_path, store, store_dir, dash, capsys):
    commits = dash.publish_history(store, TARGET, 3)
    dash.publish_history(store, "mlp/b1/default", 2, salt="m")
    dash.publish_history(store, TARGET, 2, ref="feature/x", salt="f")  # another branch
    rc, out, err = run(capsys, "--store", str(store_dir), "--out", str(tmp_path / "site"), "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["command"] == "dashboard" and doc["ref"] == "main"
    assert doc["points"] == 5 and doc["skipped"] == []
    assert doc["pages"][0] == "index.html" and len(doc["pages"]) == 3
    (t,) = [t for t in doc["targets"] if t["target"] == TARGET]
    assert t["points"] == 3 and t["latest_commit"] == commits[-1] and t["env_key"] == ENV
    assert all((tmp_path / "site" / p).is_file() for p in doc["pages"])
    for asset in (
        "uPlot.iife.min.js",
        "uPlot.min.css",
        "uPlot.LICENSE",
        "dashboard.js",
        "dashboard.css",
    ):
        assert (tmp_path / "site" / "assets" / asset).stat().st_size > 0
    assert "[2/2]" in err  # progress on stderr, stdout is the one JSON document


def test_the_other_branch_and_target_globs(tmp_path, store, store_dir, dash, capsys):
    dash.publish_history(store, TARGET, 3)
    dash.publish_history(store, TARGET, 2, ref="feature/x", salt="f")
    dash.publish_history(store, "mlp/b1/default", 2, salt="m")
    rc, out, _ = run(
        capsys,
        "--store",
        str(store_dir),
        "--out",
        str(tmp_path / "a"),
        "--ref",
        "feature/x",
        "--json",
    )
    assert rc == 0 and json.loads(out)["points"] == 2
    rc, out, _ = run(
        capsys,
        "--store",
        str(store_dir),
        "--out",
        str(tmp_path / "a"),
        "--target",
        "mlp/*",
        "--json",
    )
    doc = json.loads(out)
    assert [t["target"] for t in doc["targets"]] == ["mlp/b1/default"]
    # the resnet page of the first build is gone: the folder holds this build only
    assert sorted(p.name for p in (tmp_path / "a" / "targets").iterdir()) == [
        Path(doc["pages"][1]).name
    ]


def test_chart_data_follows_the_runs(tmp_path, store, dash):
    dash.publish_history(store, TARGET, 4)
    built = build(store, tmp_path / "site")
    data = page_json(built.pages[1])
    assert [c["id"] for c in data["charts"]] == ["latency", "p50", "speedup", "compile", "memory"]
    by_id = {c["id"]: c for c in data["charts"]}
    assert data["x"] == [0, 1, 2, 3]
    p50 = by_id["p50"]
    assert p50["unit"] == "ms"
    assert [round(v, 1) for v in p50["series"][0]["values"]] == [1.0, 1.0, 1.0, 1.2]
    cold, warm = by_id["compile"]["series"]
    assert (cold["label"], warm["label"]) == ("cold", "warm")
    assert cold["values"] == [18.2, None, None, None]
    assert warm["values"] == [None, 2.6, 2.5, 2.9]
    assert by_id["memory"]["unit"] == "MiB" and by_id["memory"]["series"][0]["values"] == [
        40,
        40,
        41,
        48,
    ]
    # normalised latency: median of compiled / reference per round (~1 ms / 0.2 ms)
    assert all(4 < v < 7 for v in by_id["latency"]["series"][0]["values"])
    assert data["labels"] == [c[:7] for c in data["commits"]]


def test_work_counters_are_charted_when_results_carry_them():
    r = make_result(TARGET)
    assert all(metrics(r)[k] is None for k in ("flops", "kernels"))
    with_work = make_result(TARGET, work=Work(flops=2_000_000, kernels=7))
    m = metrics(with_work)
    assert (m["flops"], m["bytes_accessed"], m["kernels"], m["instructions"]) == (
        2e6,
        None,
        7.0,
        None,
    )
    ids = [c["id"] for c in charts([metrics(r), m])]
    assert ids[-2:] == ["work-flops", "work-kernels"]
    assert "work-bytes_accessed" not in ids


@pytest.mark.parametrize(
    ("source", "label"),
    [("cuda", "CUDA max allocated"), ("cpu", "peak bytes allocated"), ("rss", "peak RSS growth")],
)
def test_the_memory_chart_names_each_source_the_worker_emits(source, label):
    """The dashboard had labels for cuda and rss only: the worker's cpu source (profiler
    memory events) was captioned "peak memory". It says what the details table says."""
    assert source in get_args(Memory.model_fields["source"].annotation)
    (chart,) = [c for c in charts([{"peak": float(3 << 20)}], source) if c["id"] == "memory"]
    assert chart["caption"] == label


def test_commits_link_to_the_repository(tmp_path, store, dash, monkeypatch):
    commits = dash.publish_history(store, TARGET, 3)
    built = build(store, tmp_path / "plain")
    text = built.pages[1].read_text()
    assert "/commit/" not in text and commits[0][:12] in text  # no repository: the sha
    monkeypatch.setenv("GITHUB_REPOSITORY", "acme/models")
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://ghe.example.com")
    built = build(store, tmp_path / "linked")
    data = page_json(built.pages[1])
    assert data["urls"] == [f"https://ghe.example.com/acme/models/commit/{c}" for c in commits]
    index = built.pages[0].read_text()
    assert f'href="https://ghe.example.com/acme/models/commit/{commits[-1]}"' in index
    assert commit_url("local", "acme/models", "https://github.com") is None
    assert commit_url(commits[0], "acme/models", "javascript:alert(1)") is None


def test_verdicts_are_shown_when_documents_carry_them(tmp_path, store, dash):
    dash.publish_history(store, TARGET, 3, verdicts=["pass", "regressed", "improved"])
    built = build(store, tmp_path / "site")
    assert page_json(built.pages[1])["verdicts"] == ["pass", "regressed", "improved"]
    assert '<span class="verdict v-improved">improved</span>' in built.pages[0].read_text()
    assert built.as_dict()["targets"][0]["verdict"] == "improved"
    # documents published before the field existed read as None
    old = json.loads(make_baseline(make_result(TARGET)).dump())
    old.pop("verdict")
    assert Baseline.model_validate(old).verdict is None


def test_text_from_the_store_is_escaped(tmp_path, store, dash):
    nasty = "m/<img src=x onerror=alert(1)>/v&\"'<script>"
    dash.publish_history(store, nasty, 3)
    built = build(store, tmp_path / "site")
    for page in built.pages:
        text = page.read_text()
        assert "<img" not in text and text.count("</script>") == text.count("<script")
    assert page_json(built.pages[1])["target"] == nasty
    assert html.escape(nasty) in built.pages[0].read_text()


def test_unreadable_documents_are_skipped_and_counted(tmp_path, store, store_dir, dash, capsys):
    dash.publish_history(store, TARGET, 3)
    bad = BaselineKey(TARGET, ENV, "main").history("2025-04-01T00:00:00Z", "deadbeef")
    (store_dir / bad).write_text("{not json")
    rc, out, _ = run(capsys, "--store", str(store_dir), "--out", str(tmp_path / "s"), "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["points"] == 3 and doc["skipped"] == [bad]


def test_no_baselines_is_one_line_and_exit_2(tmp_path, store, store_dir, dash, capsys):
    rc, out, err = run(capsys, "--store", str(tmp_path / "empty"), "--out", str(tmp_path / "s"))
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "no baselines of 'main'" in err
    dash.publish_history(store, TARGET, 1, ref="develop")
    rc, _, err = run(capsys, "--store", str(store_dir), "--out", str(tmp_path / "s"))
    assert rc == 2 and "(branches with baselines: develop)" in err.splitlines()[-1]
    assert not (tmp_path / "s").exists()


def test_bad_out_store_and_repository_are_errors(tmp_path, store, store_dir, dash, capsys):
    dash.publish_history(store, TARGET, 1)
    afile = tmp_path / "file"
    afile.write_text("x")
    rc, _, err = run(capsys, "--store", str(store_dir), "--out", str(afile))
    assert rc == 2 and "not a directory" in err
    rc, _, err = run(capsys, "--store", str(afile), "--out", str(tmp_path / "s"))
    assert rc == 2 and err.startswith("gatekeeper: error:") and err.count("\n") == 1
    rc, _, err = run(
        capsys,
        "--store",
        str(store_dir),
        "--out",
        str(tmp_path / "s"),
        "--repository",
        "not a repo",
    )
    assert rc == 2 and "owner/name" in err
    with pytest.raises(SystemExit) as exit_:
        run(capsys, "--store", str(store_dir))
    assert exit_.value.code == 2 and "--out" in capsys.readouterr().err


def test_from_an_s3_store(tmp_path, s3_bucket_uri, dash, capsys):
    store = open_store(str(s3_bucket_uri), endpoint_url=s3_bucket_uri.endpoint_url)
    dash.publish_history(store, TARGET, 3)
    rc, out, _ = run(
        capsys, "--store", str(s3_bucket_uri), "--out", str(tmp_path / "site"), "--json"
    )
    doc = json.loads(out)
    assert rc == 0 and doc["points"] == 3 and len(doc["pages"]) == 2
