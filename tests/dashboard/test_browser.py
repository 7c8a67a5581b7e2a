"""The dashboard in a real browser: headless Chromium opens a target page from file://
(no network), and the charts must have drawn every published run.

Two independent witnesses: the DOM after the scripts ran (each chart's figure records
what its draw put inside the plotting area: ``data-points``), and a screenshot (the
series' line colour must be on screen inside each chart's plotting area). A positive
control breaks the chart library and checks that both witnesses say so.

``GATEKEEPER_WRITE_EXAMPLE=1`` also writes the realistic page's screenshot to
``docs/assets/dashboard.png`` (the dashboard page's picture).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from gatekeeper.cli import main
from gatekeeper.dashboard.data import COLORS

ROOT = Path(__file__).resolve().parents[2]
TARGET = "resnet-tiny/b8/max-autotune"
CHARTS = ["latency", "p50", "speedup", "compile", "memory"]


def build(store_dir: Path, out: Path, capsys, *extra: str) -> dict:
    rc = main(
        [
            "dashboard",
            "--store",
            str(store_dir),
            "--out",
            str(out),
            "--json",
            "--repository",
            "acme/models",
            *extra,
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    return doc


def page_json(page: Path) -> dict:
    text = page.read_text()
    m = re.search(r'<script type="application/json" id="gk-data">(.*?)</script>', text, re.S)
    assert m
    return json.loads(m.group(1))


def assert_rendered(dom, points: int) -> None:
    """Every chart drew ``points`` commits inside its plotting area."""
    assert [f.get("data-chart") for f in dom.figures] == CHARTS
    drawn = {f["data-chart"]: f.get("data-points") for f in dom.figures}
    assert drawn == {c: str(points) for c in CHARTS}, drawn
    assert dom.body.get("data-charts-rendered") == str(len(CHARTS))


def assert_lines_on_screen(dash, png: Path, dom, page: Path) -> None:
    """The series' colours are on screen inside every chart's plotting area."""
    specs = {c["id"]: c for c in page_json(page)["charts"]}
    for fig in dom.figures:
        x, y, w, h = (int(v) for v in fig["data-box"].split(","))
        assert w > 100 and h > 100, fig
        colours = [s["color"] for s in specs[fig["data-chart"]]["series"]]
        pixels = dash.line_pixels(png, colours, (x, y, w, h))
        assert pixels > 150, f"{fig['data-chart']}: only {pixels} pixels of {colours}"


@pytest.fixture
def site(tmp_path: Path, store, store_dir: Path, dash, capsys) -> tuple[Path, Path, list[str]]:
    commits = dash.publish_history(store, TARGET, 3)
    out = tmp_path / "site"
    doc = build(store_dir, out, capsys)
    assert doc["points"] == 3
    (target,) = doc["targets"]
    return out, out / target["page"], commits


def test_every_chart_draws_every_published_run(site, dash, tmp_path: Path) -> None:
    out, page, commits = site
    dom = dash.Dom(dash.dump_dom(page))
    assert_rendered(dom, 3)
    for sha in commits:  # the runs table links each commit
        assert f"https://github.com/acme/models/commit/{sha}" in dom.links
    png = dash.screenshot(page, tmp_path / "page.png")
    assert_lines_on_screen(dash, png, dom, page)


def test_a_broken_chart_library_is_caught(site, dash, tmp_path: Path) -> None:
    """Positive control: with uPlot gone, the DOM check and the screenshot check fail."""
    out, page, _ = site
    (out / "assets" / "uPlot.iife.min.js").write_text("/* not uPlot */\n")
    dom = dash.Dom(dash.dump_dom(page))
    with pytest.raises(AssertionError):
        assert_rendered(dom, 3)
    assert all("data-points" not in f for f in dom.figures)
    png = dash.screenshot(page, tmp_path / "broken.png")
    assert dash.line_pixels(png, list(COLORS)) == 0


def test_the_example_page_renders(tmp_path: Path, store, store_dir: Path, dash, capsys) -> None:
    """The docs' picture (docs/assets/dashboard.png): six runs (a regression at the
    fourth, fixed at the fifth; the first compile cold) with the gate's verdicts, and a
    second target."""
    dash.publish_history(
        store, TARGET, 6, verdicts=["no-baseline", "pass", "pass", "regressed", "improved", "pass"]
    )
    dash.publish_history(store, "mlp/b1/default", 3, salt="mlp")
    out = tmp_path / "site"
    doc = build(store_dir, out, capsys)
    assert doc["points"] == 9 and len(doc["pages"]) == 3
    page = out / next(t["page"] for t in doc["targets"] if t["target"] == TARGET)
    dom = dash.Dom(dash.dump_dom(page))
    assert_rendered(dom, 6)
    png = dash.screenshot(page, tmp_path / "example.png")
    assert_lines_on_screen(dash, png, dom, page)
    index = dash.Dom(dash.dump_dom(out / "index.html"))
    assert sum("targets/" in link for link in index.links) == 2
    if os.environ.get("GATEKEEPER_WRITE_EXAMPLE") == "1":
        shutil.copyfile(png, ROOT / "docs" / "assets" / "dashboard.png")
