"""A store with a baseline history (published as ``run --publish`` would, no compiles),
and headless Chromium to look at the dashboard built from it."""

from __future__ import annotations

import hashlib
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.browser import chromium
from support.factories import make_result

from gatekeeper.gate.baseline import publish_result
from gatekeeper.gate.drift import HISTORY_FOR_NOISE, measure_noise
from gatekeeper.results import Baseline
from gatekeeper.store import Store, baselines, open_store


def sha(i: int, salt: str = "") -> str:
    return hashlib.sha1(f"commit {salt}{i}".encode()).hexdigest()


# per run: compiled seconds, compile seconds, warm, compiled peak MiB (a regression in
# run 4, fixed in run 5; the first compile is cold)
RUNS = [
    (1.00e-3, 18.2, False, 40),
    (0.98e-3, 2.6, True, 40),
    (1.01e-3, 2.5, True, 41),
    (1.22e-3, 2.9, True, 48),
    (0.97e-3, 2.4, True, 41),
    (0.93e-3, 2.4, True, 40),
]


def publish_history(
    store: Store,
    target: str,
    runs: int = 3,
    *,
    ref: str = "main",
    salt: str = "",
    verdicts: list[str] | None = None,
) -> list[str]:
    """``runs`` baselines of ``target`` on ``ref``, one per commit, with changing
    numbers (published by publish_result); returns the commits, oldest first.

    With ``verdicts`` each document also carries the gate's verdict, as publishing will
    once it records one (the document is then built as publish_result builds it)."""
    commits = []
    for i in range(runs):
        compiled, compile_s, warm, peak = RUNS[i % len(RUNS)]
        r = make_result(
            target,
            seed=i + 1,
            compiled_s=compiled,
            compile_s=compile_s,
            warm=warm,
            cache="hit" if warm else "cold",
            peak=peak << 20,
            code_hash="c0de1234" if i < 3 else "c0de5678",
        )
        r.measured_at = f"2025-03-{i + 1:02d}T12:00:00Z"
        commits.append(sha(i, salt))
        if verdicts is None:
            status = publish_result(store, r, ref=ref, commit=commits[-1])
        else:
            key = baselines.BaselineKey(target, r.env_key, ref)
            recent = [d.result for d in baselines.history(store, key, HISTORY_FOR_NOISE)]
            doc = Baseline(
                target=target,
                env_key=r.env_key,
                ref=ref,
                commit=commits[-1],
                created_at=r.measured_at,
                published_at=r.measured_at,
                result=r,
                noise=measure_noise(r, recent),
                verdict=verdicts[i],
            )
            status = baselines.publish(store, key, doc)
        assert status == "published"
    return commits


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(store_dir: Path) -> Store:
    return open_store(str(store_dir))


# -------------------------------------------------------------------------- the browser


def dump_dom(page: Path) -> str:
    """The DOM after the page's scripts ran (virtual time lets them finish)."""
    proc = chromium("--virtual-time-budget=5000", "--dump-dom", page.as_uri())
    assert proc.returncode == 0 and "<html" in proc.stdout, proc.stderr[-2000:]
    return proc.stdout


def screenshot(page: Path, dest: Path) -> Path:
    proc = chromium("--virtual-time-budget=5000", f"--screenshot={dest}", page.as_uri())
    assert proc.returncode == 0 and dest.is_file(), proc.stderr[-2000:]
    return dest


class Dom(HTMLParser):
    """The attributes of <body> and of every <figure class="chart">."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.body: dict[str, str] = {}
        self.figures: list[dict[str, str]] = []
        self.links: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "body":
            self.body = a
        elif tag == "figure" and "chart" in a.get("class", "").split():
            self.figures.append(a)
        elif tag == "a" and "href" in a:
            self.links.append(a["href"])


def line_pixels(
    png: Path, colors: list[str], box: tuple[int, int, int, int] | None = None, tolerance: int = 12
) -> int:
    """Pixels of ``png`` (inside ``box``: x, y, width, height) within ``tolerance`` of
    any of ``colors`` (``#rrggbb``)."""
    import numpy as np
    from PIL import Image

    img = np.asarray(Image.open(png).convert("RGB")).astype(int)
    if box is not None:
        x, y, w, h = box
        img = img[y : y + h, x : x + w]
    hit = np.zeros(img.shape[:2], dtype=bool)
    for c in colors:
        rgb = np.array([int(c[i : i + 2], 16) for i in (1, 3, 5)])
        hit |= np.abs(img - rgb).max(axis=2) <= tolerance
    return int(hit.sum())


@pytest.fixture
def dash():
    """The helpers above, for the test modules (conftest is not importable by them)."""
    return SimpleNamespace(
        publish_history=publish_history,
        sha=sha,
        dump_dom=dump_dom,
        screenshot=screenshot,
        Dom=Dom,
        line_pixels=line_pixels,
        chromium=chromium,
    )
