"""From the store's baseline history to chart data: one :class:`Series` per target and
environment of a branch, one point per published run (oldest first), and the charts a
target page draws from them. Reading goes through :mod:`gatekeeper.store.baselines`
(its key scheme and parser); the rest is pure.
"""

from __future__ import annotations

import fnmatch
import math
import re
import statistics
from dataclasses import dataclass, field
from typing import IO, Any

from .. import metrics as registry
from .. import units
from ..errors import GatekeeperError
from ..gate.drift import is_normalised, normalised_latency
from ..progress import Progress
from ..results import Baseline, TargetResult
from ..store import Store, baselines

# the line colours of the charts (the browser test looks for the first on screen)
COLORS = ("#2563eb", "#ea580c")
_SHA = re.compile(r"[0-9a-f]{7,40}")
_REPOSITORY = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")


@dataclass
class Series:
    """Every published run of one target in one environment on one branch."""

    target: str
    env_key: str
    ref: str
    docs: list[Baseline] = field(default_factory=list)  # oldest first

    @property
    def latest(self) -> Baseline:
        return self.docs[-1]


@dataclass
class History:
    series: list[Series]
    skipped: list[str]  # keys of history documents that did not parse (or hold no run)


def read_history(
    store: Store, ref: str, globs: list[str] | None = None, stream: IO[str] | None = None
) -> History:
    """Every history document of ``ref`` in the store, per target and env key (one
    listing, then one read per document; progress on ``stream``)."""
    groups: dict[baselines.BaselineKey, list[str]] = {}
    refs: set[str] = set()
    for info in store.list(baselines.ROOT):
        p = baselines.parse_key(info.key)
        if p is None or p.kind != "history":
            continue
        refs.add(p.baseline.ref)
        if p.baseline.ref == ref and (
            not globs or any(fnmatch.fnmatchcase(p.baseline.target_id, g) for g in globs)
        ):
            groups.setdefault(p.baseline, []).append(info.key)
    if not groups:
        other = f" (branches with baselines: {', '.join(sorted(refs))})" if refs else ""
        only = f" matching {' '.join(globs)}" if globs and ref in refs else ""
        raise GatekeeperError(
            f"no baselines of {ref!r}{only} in {store.uri}{other}: publish "
            "one with 'gatekeeper baseline' or 'gatekeeper run --publish'"
        )
    progress = Progress(len(groups), stream)
    out, skipped = [], []
    for key in sorted(groups, key=lambda k: (k.target_id, k.env_key)):
        keys = sorted(groups[key])
        s = Series(key.target_id, key.env_key, ref)
        with progress.step(
            f"{key.target_id} ({key.env_key})", f"reading {len(keys)} baseline(s)"
        ) as step:
            for k in keys:
                doc = baselines.read_doc(store, k)
                if doc is None or doc.result.status != "ok":
                    skipped.append(k)
                else:
                    s.docs.append(doc)
            s.docs.sort(key=lambda d: d.created_at)
            step.done(f"{len(s.docs)} point(s)")
        if s.docs:
            out.append(s)
    if not out:
        raise GatekeeperError(
            f"none of the {len(skipped)} baseline document(s) of {ref!r} in {store.uri} is readable"
        )
    return History(out, skipped)


# ------------------------------------------------------------------------- one run's numbers


def metrics(r: TargetResult) -> dict[str, float | None]:
    """The charted figures of one measured run; None where it did not measure one."""
    lat, comp, mem = r.latency, r.compile, r.memory
    norm = normalised_latency(r)
    out: dict[str, float | None] = {
        "normalised": statistics.median(norm) if norm and is_normalised(r) else None,
        "p50": lat.compiled.p50 if lat else None,
        "speedup": lat.speedup if lat else None,
        "compile_cold": comp.seconds if comp and not comp.warm else None,
        "compile_warm": comp.seconds if comp and comp.warm else None,
        "peak": float(mem.compiled_peak_bytes)
        if mem and mem.compiled_peak_bytes is not None
        else None,
    }
    for m in registry.registry():  # every metric charted on its own (the work counters)
        if m.chart is not None:
            out[m.name] = m.value(r)
    return {k: v if v is None or math.isfinite(v) else None for k, v in out.items()}


def commit_url(sha: str | None, repository: str | None, server_url: str) -> str | None:
    """``<server>/<owner>/<repo>/commit/<sha>``, or None when either is unknown (or
    does not look like what it should)."""
    if (
        not sha
        or not repository
        or not _SHA.fullmatch(sha)
        or not _REPOSITORY.fullmatch(repository)
    ):
        return None
    if not re.fullmatch(r"https?://[^\s\"'<>]+", server_url):
        return None
    return f"{server_url.rstrip('/')}/{repository}/commit/{sha}"


def valid_repository(repository: str) -> bool:
    return bool(_REPOSITORY.fullmatch(repository))


def doc_repository(doc: Baseline) -> str | None:
    """The repository a baseline names, if its schema carries one (creator or result)."""
    for holder in (doc, doc.result):
        creator = getattr(holder, "creator", None)
        repo = (
            creator.get("repository")
            if isinstance(creator, dict)
            else getattr(holder, "repository", None)
        )
        if isinstance(repo, str) and valid_repository(repo):
            return repo
    return None


# ------------------------------------------------------------------------------- charts


def _chart(
    cid: str,
    title: str,
    caption: str,
    unit: str,
    series: list[tuple[str, list]],
    compact: bool = False,
) -> dict:
    return {
        "id": cid,
        "title": title,
        "caption": caption,
        "unit": unit,
        "compact": compact,
        "series": [
            {"label": label, "color": COLORS[i % len(COLORS)], "values": vals}
            for i, (label, vals) in enumerate(series)
        ],
    }


class _Columns:
    """One figure of every run, by key; None is a gap."""

    def __init__(self, points: list[dict[str, float | None]]) -> None:
        self.points = points

    def col(self, key: str) -> list[float | None]:
        return [p.get(key) for p in self.points]

    def present(self, *keys: str) -> bool:
        return any(v is not None for k in keys for v in self.col(k))

    def known(self, key: str) -> list[float]:
        return [v for v in self.col(key) if v is not None]

    def scaled(self, key: str, scale: float) -> list[float | None]:
        return [None if v is None else v / scale for v in self.col(key)]


def charts(points: list[dict[str, float | None]], memory_kind: str | None = None) -> list[dict]:
    """The charts of one target page: a chart is drawn when any run has its figure.
    Values are scaled to the chart's unit; None is a gap."""
    c = _Columns(points)
    return _timing_charts(c) + _resource_charts(c, memory_kind)


def _timing_charts(c: _Columns) -> list[dict]:
    out = []
    if c.present("normalised"):
        out.append(
            _chart(
                "latency",
                "Normalised latency",
                "median per round of compiled latency ÷ the reference workload "
                "timed in the same round (what the gate compares across runs)",
                "× reference",
                [("compiled / reference", c.col("normalised"))],
            )
        )
    if c.present("p50"):
        unit, scale = units.time_unit(c.known("p50"))
        out.append(
            _chart(
                "p50",
                "Compiled latency p50",
                "median seconds per call, compiled",
                unit,
                [("compiled p50", c.scaled("p50", scale))],
            )
        )
    if c.present("speedup"):
        out.append(
            _chart(
                "speedup",
                "Speedup vs eager",
                "median eager ÷ median compiled",
                "x",
                [("speedup", c.col("speedup"))],
            )
        )
    if c.present("compile_cold", "compile_warm"):
        out.append(
            _chart(
                "compile",
                "Compile time",
                "first compiled call; warm when the bundle was restored from the "
                "store, cold otherwise",
                "s",
                [("cold", c.col("compile_cold")), ("warm", c.col("compile_warm"))],
            )
        )
    return out


def _resource_charts(c: _Columns, memory_kind: str | None) -> list[dict]:
    out = []
    if c.present("peak"):
        unit, scale = units.bytes_unit(c.known("peak"))
        how = registry.get("memory").sources.get(memory_kind or "", "peak memory")
        out.append(
            _chart(
                "memory",
                "Peak memory (compiled)",
                how,
                unit,
                [("compiled peak", c.scaled("peak", scale))],
            )
        )
    for m in registry.registry():
        if m.chart is not None and c.present(m.name):
            ch = m.chart
            out.append(
                _chart(
                    ch.id, ch.title, ch.caption, ch.unit, [(ch.title, c.col(m.name))], ch.compact
                )
            )
    return out


def page_data(s: Series, repository: str | None, server_url: str) -> dict[str, Any]:
    """Everything a target page's script needs, as one JSON-able document."""
    points = [metrics(d.result) for d in s.docs]
    repo_of = [repository or doc_repository(d) for d in s.docs]
    mem = s.latest.result.memory
    return {
        "target": s.target,
        "env_key": s.env_key,
        "ref": s.ref,
        "x": list(range(len(s.docs))),
        "labels": [(d.commit or "local")[:7] for d in s.docs],
        "commits": [d.commit for d in s.docs],
        "urls": [
            commit_url(d.commit, repo, server_url) for d, repo in zip(s.docs, repo_of, strict=True)
        ],
        "measured": [d.created_at for d in s.docs],
        "verdicts": [getattr(d, "verdict", None) for d in s.docs],
        "charts": charts(points, mem.source if mem else None),
    }
