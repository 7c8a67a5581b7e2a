"""The static site: ``index.html`` (every target, its latest run), one page per target and
environment under ``targets/``, and ``assets/`` (uPlot, its licence, our script and
styles). Relative links only and every script local, so the folder opens from file://
and from any static host. Text from the store is escaped; the page data travels as JSON
in a ``<script type="application/json">`` element, with ``<``, ``>`` and ``&`` escaped.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import html
import json
import re
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

from .. import units
from ..report.trend import sparkline
from .data import Series, metrics, page_data

ASSETS = ("uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE", "dashboard.js", "dashboard.css")
PAGES = "targets"


def e(text: Any) -> str:
    return html.escape("" if text is None else str(text), quote=True)


def page_name(s: Series) -> str:
    """A file name for a target and env key: readable, and unique by its hash."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "-", s.target).strip("-")[:80]
    digest = hashlib.sha256(f"{s.target}\0{s.env_key}".encode()).hexdigest()[:8]
    return f"{readable}-{digest}.html"


def _json_script(doc: Any) -> str:
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


# ------------------------------------------------------------------------------ numbers


def fmt_compile(m: dict) -> str:
    if m.get("compile_warm") is not None:
        return f"{m['compile_warm']:.2f} s warm"
    if m.get("compile_cold") is not None:
        return f"{m['compile_cold']:.2f} s cold"
    return units.DASH


def fmt_when(iso: str) -> str:
    """``2025-03-06T12:00:00Z`` as ``2025-03-06 12:00``; anything else as it is."""
    try:
        when = dt.datetime.fromisoformat(iso)
    except ValueError:
        return iso
    if when.tzinfo is not None:
        when = when.astimezone(dt.UTC)
    return when.strftime("%Y-%m-%d %H:%M")


def _commit(sha: str | None, url: str | None) -> str:
    short = e((sha or "local")[:12])
    return f'<a href="{e(url)}"><code>{short}</code></a>' if url else f"<code>{short}</code>"


def _verdict(v: str | None) -> str:
    if not v:
        return '<span class="verdict none">–</span>'
    return f'<span class="verdict v-{e(re.sub(r"[^a-z-]", "", v))}">{e(v)}</span>'


def _head(title: str, up: str, uplot: bool) -> str:
    css = f'<link rel="stylesheet" href="{up}assets/uPlot.min.css">\n' if uplot else ""
    return (
        f'<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{e(title)}</title>\n{css}"
        f'<link rel="stylesheet" href="{up}assets/dashboard.css">\n</head>\n'
    )


# -------------------------------------------------------------------------------- pages


def index_html(
    history: list[Series],
    ref: str,
    pages: dict[int, str],
    generated: str,
    repository: str | None,
    server_url: str,
) -> str:
    rows = []
    for i, s in enumerate(history):
        d = page_data(s, repository, server_url)
        m = metrics(s.latest.result)
        trend = sparkline(
            [metrics(doc.result)["normalised"] or float("nan") for doc in s.docs], None
        )
        rows.append(
            f'<tr><td><a href="{PAGES}/{e(pages[i])}">{e(s.target)}</a></td>'
            f'<td><code class="env">{e(s.env_key)}</code></td>'
            f'<td class="num">{len(s.docs)}</td>'
            f'<td class="trend" title="normalised latency, oldest to newest">{e(trend)}</td>'
            f"<td>{_commit(s.latest.commit, d['urls'][-1])}</td>"
            f'<td class="when">{e(fmt_when(s.latest.created_at))}</td>'
            f"<td>{_verdict(getattr(s.latest, 'verdict', None))}</td>"
            f'<td class="num">{units.seconds(m["p50"])}</td>'
            f'<td class="num">{units.speedup(m["speedup"])}</td>'
            f'<td class="num">{fmt_compile(m)}</td>'
            f'<td class="num">{units.size(m["peak"])}</td></tr>'
        )
    targets = len({s.target for s in history})
    return (
        _head(f"gatekeeper: {ref}", "", uplot=False)
        + '<body data-page="index">\n<header>\n<h1>gatekeeper</h1>\n'
        f"<p>Baselines of <code>{e(ref)}</code>: {targets} target(s), "
        f"{len(history)} page(s). Generated {e(generated)}.</p>\n</header>\n<main>\n"
        '<table class="targets">\n<thead><tr><th>target</th><th>env key</th>'
        "<th>runs</th><th>trend</th><th>latest commit</th><th>measured (UTC)</th>"
        "<th>verdict</th><th>compiled p50</th><th>speedup</th><th>compile</th>"
        "<th>peak memory</th></tr></thead>\n<tbody>\n"
        + "\n".join(rows)
        + "\n</tbody>\n</table>\n</main>\n</body>\n</html>\n"
    )


def target_html(s: Series, repository: str | None, server_url: str, generated: str) -> str:
    d = page_data(s, repository, server_url)
    figures = "\n".join(
        f'<figure class="chart" data-chart="{e(c["id"])}">\n'
        f'<figcaption><b>{e(c["title"])}</b> <span class="unit">({e(c["unit"])})</span>'
        f'<br><small>{e(c["caption"])}</small></figcaption>\n<div class="plot"></div>\n'
        "</figure>"
        for c in d["charts"]
    )
    rows = []
    for i in reversed(range(len(s.docs))):
        doc, m = s.docs[i], metrics(s.docs[i].result)
        g = doc.result.graphs
        rows.append(
            f'<tr><td class="num">{i + 1}</td><td>{_commit(doc.commit, d["urls"][i])}</td>'
            f'<td class="when">{e(fmt_when(doc.created_at))}</td>'
            f"<td>{_verdict(d['verdicts'][i])}</td>"
            f"<td><code>{e(doc.result.code_hash[:12])}</code></td>"
            f'<td class="num">{units.number(m["normalised"])}</td>'
            f'<td class="num">{units.seconds(m["p50"])}</td>'
            f'<td class="num">{units.speedup(m["speedup"])}</td>'
            f'<td class="num">{fmt_compile(m)}</td>'
            f'<td class="num">{units.size(m["peak"])}</td>'
            f'<td class="num">{"–" if g is None else g.breaks}</td></tr>'
        )
    latest = s.latest
    v = getattr(latest, "verdict", None)
    verdict = f", verdict {_verdict(v)}" if v else ""
    return (
        _head(f"{s.target} · gatekeeper", "../", uplot=True)
        + f'<body data-page="target" data-charts="{len(d["charts"])}">\n'
        '<nav><a href="../index.html">← all targets</a></nav>\n<header>\n'
        f"<h1>{e(s.target)}</h1>\n<p>Branch <code>{e(s.ref)}</code>, env key "
        f'<code class="env">{e(s.env_key)}</code>: {len(s.docs)} run(s); latest '
        f"{_commit(latest.commit, d['urls'][-1])} measured "
        f"{e(fmt_when(latest.created_at))} UTC{verdict}. Generated {e(generated)}. "
        "Click a point to open its commit.</p>\n</header>\n<main>\n"
        f'<section class="charts">\n{figures}\n</section>\n'
        "<noscript><p>The charts need JavaScript; the table below has every run."
        "</p></noscript>\n<h2>Runs</h2>\n"
        '<table class="runs">\n<thead><tr><th>#</th><th>commit</th><th>measured (UTC)</th>'
        "<th>verdict</th><th>code hash</th><th>normalised</th><th>compiled p50</th>"
        "<th>speedup</th><th>compile</th><th>peak memory</th><th>graph breaks</th>"
        "</tr></thead>\n<tbody>\n" + "\n".join(rows) + "\n</tbody>\n</table>\n</main>\n"
        f'<script type="application/json" id="gk-data">{_json_script(d)}</script>\n'
        '<script src="../assets/uPlot.iife.min.js"></script>\n'
        '<script src="../assets/dashboard.js"></script>\n</body>\n</html>\n'
    )


def write_site(
    history: list[Series], out: Path, *, ref: str, repository: str | None, server_url: str
) -> list[Path]:
    """Write the whole site under ``out``; returns the pages written (index first).
    Pages of targets no longer in the history are removed from ``out/targets``."""
    generated = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    assets, pages_dir = out / "assets", out / PAGES
    assets.mkdir(parents=True, exist_ok=True)
    pages_dir.mkdir(exist_ok=True)
    static = resources.files("gatekeeper.dashboard") / "static"
    for name in ASSETS:
        with resources.as_file(static / name) as src:
            shutil.copyfile(src, assets / name)
    names = {i: page_name(s) for i, s in enumerate(history)}
    written = []
    for i, s in enumerate(history):
        path = pages_dir / names[i]
        path.write_text(target_html(s, repository, server_url, generated), encoding="utf-8")
        written.append(path)
    for stale in pages_dir.glob("*.html"):
        if stale.name not in names.values():
            stale.unlink()
    index = out / "index.html"
    index.write_text(
        index_html(history, ref, names, generated, repository, server_url), encoding="utf-8"
    )
    return [index, *written]
