"""``gatekeeper dashboard``: a static site of a branch's baseline history.

Every history document of the branch (``baselines/<target>/<env>/<ref>/history/``, read
through :mod:`gatekeeper.store.baselines`, local or S3) becomes one point; each target
and env key gets a page with charts over commits (normalised latency, compiled p50,
speedup vs eager, cold and warm compile time, compiled peak memory, and the work
counters when the results carry them) and a table of its runs; ``index.html`` lists
every target with its latest run and verdict.

* ``data``  the store's history → series and chart data (reading, then pure)
* ``site``  the HTML pages and the copied assets

The charts are drawn by uPlot 1.6.32 (https://github.com/leeoniya/uPlot, MIT, by Leon
Sorokin), vendored in ``static/`` from the npm package ``uplot@1.6.32``
(``dist/uPlot.iife.min.js``, ``dist/uPlot.min.css`` and ``LICENSE`` as
``uPlot.LICENSE``, unmodified). Why uPlot: a maintained, dependency-free time-series
library of about 50 KB that draws thousands of points fast on a canvas, with axes,
gaps, a live legend and cursor built in; hand-drawn SVG would need all of those written
and tested here. Why vendored: the site must open offline from file:// (no CDN), so the
files ship as package data and are copied into the site's ``assets/``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..errors import GatekeeperError, UsageError
from ..store import Store
from .data import History, Series, read_history, valid_repository
from .site import write_site

__all__ = ["Built", "History", "Series", "build"]

UPLOT_VERSION = "1.6.32"


@dataclass
class Built:
    out: Path
    ref: str
    pages: list[Path]  # index.html first
    series: list[Series]
    skipped: list[str]  # history documents that could not be read

    @property
    def points(self) -> int:
        return sum(len(s.docs) for s in self.series)

    def as_dict(self) -> dict:
        return {
            "out": str(self.out),
            "ref": self.ref,
            "index": str(self.pages[0]),
            "pages": [str(p.relative_to(self.out)) for p in self.pages],
            "points": self.points,
            "skipped": self.skipped,
            "targets": [
                {
                    "target": s.target,
                    "env_key": s.env_key,
                    "points": len(s.docs),
                    "page": str(p.relative_to(self.out)),
                    "latest_commit": s.latest.commit,
                    "measured_at": s.latest.created_at,
                    "verdict": getattr(s.latest, "verdict", None),
                }
                for s, p in zip(self.series, self.pages[1:], strict=True)
            ],
        }


def build(
    store: Store,
    out: Path,
    *,
    ref: str = "main",
    globs: list[str] | None = None,
    repository: str | None = None,
    server_url: str | None = None,
    stream: IO[str] | None = None,
) -> Built:
    """Read ``ref``'s baseline history from ``store`` and write the site under ``out``.

    Commit links need the repository (``owner/name``): ``repository``, else
    ``$GITHUB_REPOSITORY``; on ``server_url``, else ``$GITHUB_SERVER_URL``, else
    https://github.com. Without one, commits are shown as plain shas."""
    repository = repository or os.environ.get("GITHUB_REPOSITORY") or None
    if repository is not None and not valid_repository(repository):
        raise UsageError(f"--repository expects owner/name, got {repository!r}")
    server_url = server_url or os.environ.get("GITHUB_SERVER_URL") or "https://github.com"
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: not a directory")
    history: History = read_history(store, ref, globs, stream)
    try:
        pages = write_site(
            history.series, out, ref=ref, repository=repository, server_url=server_url
        )
    except OSError as e:
        raise GatekeeperError(f"cannot write the dashboard to {out}: {e.strerror or e}") from e
    return Built(out, ref, pages, history.series, history.skipped)
