"""Baselines in the store: publish (compare-and-swap, history append-only), fetch, list.

    baselines/<target-id>/<env-key>/<ref>/latest.json
    baselines/<target-id>/<env-key>/<ref>/history/<measured-at>-<commit>.json
    baselines/<target-id>/<env-key>/<ref>/outputs/<sha16>.pt    (reference outputs)

``latest`` only ever moves forward in measurement time: an older run that publishes late
goes into history but never replaces a newer baseline.
"""
from __future__ import annotations

import random
import time
from pathlib import Path
from urllib.parse import quote

from pydantic import ValidationError

from .hashing import sha256_file
from .bundle import now_iso
from . import stats
from .errors import GatekeeperError, PreconditionFailed, StoreError
from .gate import DEFAULT_DRIFT
from .results import (Baseline, Noise, Reference, RunMedians, TargetResult,
                      normalised_latency, run_medians)
from .store import Store

CAS_ATTEMPTS = 30


def ref_slug(ref: str) -> str:
    """A branch name as one path segment: ``feature/x`` -> ``feature%2Fx``."""
    return quote(ref, safe="")


def prefix(target_id: str, env_key: str, ref: str) -> str:
    return f"baselines/{target_id}/{env_key}/{ref_slug(ref)}"


def _stamp(iso: str) -> str:
    return "".join(ch for ch in iso if ch.isdigit())[:17]


def publish(store: Store, result: TargetResult, *, ref: str, commit: str | None,
            reference_file: Path | None = None) -> str:
    """Publish one target's result as the baseline of ``ref``.

    Returns ``published``, ``older`` (history only: a newer baseline is in place) or
    ``skipped`` (read-only store).
    """
    if result.status != "ok" or result.measured_at is None:
        raise GatekeeperError(f"{result.target}: cannot publish a failed measurement "
                              "as a baseline")
    base = prefix(result.target, result.env_key, ref)
    reference_key = None
    if reference_file is not None and result.reference is not None:
        digest = sha256_file(reference_file)
        if digest != result.reference.sha256:
            raise GatekeeperError(f"{result.target}: reference outputs {reference_file} do "
                                  "not match the sha256 in the results")
        reference_key = f"{base}/outputs/{digest[:16]}.pt"
        try:
            if store.write(reference_key, reference_file, if_none_match=True) is None:
                return "skipped"
        except PreconditionFailed:
            pass  # the same outputs are stored already: the name is their hash
    doc = Baseline(target=result.target, env_key=result.env_key, ref=ref, commit=commit,
                   created_at=result.measured_at, published_at=now_iso(), result=result,
                   reference_key=reference_key,
                   noise=measure_noise(result, recent_history(store, base)))
    data = doc.dump()
    try:
        if store.write(f"{base}/history/{_stamp(doc.created_at)}-{(commit or 'local')[:12]}"
                       ".json", data, if_none_match=True) is None:
            return "skipped"
    except PreconditionFailed:
        pass  # this very run was published before
    latest = f"{base}/latest.json"
    for attempt in range(CAS_ATTEMPTS):
        current = store.read(latest)
        if current is not None:
            existing = _parse(current[0], latest)
            if existing is not None and existing.created_at > doc.created_at:
                return "older"
        try:
            written = store.write(latest, data, if_none_match=current is None,
                                  if_match=current[1] if current else None)
            return "published" if written is not None else "skipped"
        except PreconditionFailed:
            time.sleep(random.uniform(0, 0.05 * 2 ** min(attempt, 5)))  # backoff + jitter
    raise StoreError(f"{latest}: kept changing over {CAS_ATTEMPTS} attempts; try again")


HISTORY_FOR_NOISE = 10  # runs (processes) behind a baseline's noise figures


def recent_history(store: Store, base: str) -> list[TargetResult]:
    """The newest few published results of this target, env and ref."""
    infos = sorted(store.list(f"{base}/history/"), key=lambda i: i.key)[-HISTORY_FOR_NOISE:]
    out = []
    for info in infos:
        got = store.read(info.key)
        doc = _parse(got[0], info.key) if got else None
        if doc is not None:
            out.append(doc.result)
    return out


def measure_noise(result: TargetResult, history: list[TargetResult]) -> Noise | None:
    """Within-process noise of this run, and the drift between runs of the same code
    over the recent history: the second is what one run's samples cannot show, and
    what the stored-baseline gate pays for (see gatekeeper.gate)."""
    samples = normalised_latency(result)
    if len(samples) < 5:
        return None
    within = stats.noise(samples)
    runs = [RunMedians(measured_at=r.measured_at or "", code_hash=r.code_hash,
                       latency=lat, vs_eager=ratio,
                       normalised=bool(r.latency and r.latency.samples.get("reference")))
            for r in [*(h for h in history if h.measured_at != result.measured_at), result]
            for lat, ratio in run_medians(r)][-HISTORY_FOR_NOISE:]
    mine = [m for m in runs if m.normalised == runs[-1].normalised]
    between, df = stats.pooled_sd(_by_code(mine, "latency"))
    vs_eager_between, _ = stats.pooled_sd(_by_code(mine, "vs_eager"))
    same = sum(m.code_hash == result.code_hash for m in mine)
    detectable = stats.runs_detectable_change(between or DEFAULT_DRIFT,
                                              df if between else None, same)
    return Noise(within=within, between=between, vs_eager_between=vs_eager_between, df=df,
                 runs=runs, detectable=detectable)


def _by_code(runs: list[RunMedians], field: str) -> list[list[float]]:
    groups: dict[str, list[float]] = {}
    for m in runs:
        groups.setdefault(m.code_hash, []).append(getattr(m, field))
    return list(groups.values())


def _parse(data: bytes, key: str) -> Baseline | None:
    try:
        return Baseline.model_validate_json(data)
    except ValidationError:
        return None  # an unreadable baseline: treated as absent, replaced on publish


def fetch(store: Store, target_id: str, env_key: str, ref: str) -> Baseline | None:
    key = f"{prefix(target_id, env_key, ref)}/latest.json"
    got = store.read(key)
    if got is None:
        return None
    doc = _parse(got[0], key)
    if doc is None:
        raise StoreError(f"{key}: not a valid gatekeeper baseline")
    return doc


def fetch_reference(store: Store, baseline: Baseline, dest: Path) -> Path | None:
    """Download the baseline's reference outputs, verified against their sha256."""
    ref: Reference | None = baseline.result.reference
    if baseline.reference_key is None or ref is None:
        return None
    store.download(baseline.reference_key, dest)
    if sha256_file(dest) != ref.sha256:
        dest.unlink(missing_ok=True)
        raise StoreError(f"{baseline.reference_key}: sha256 does not match the baseline")
    return dest


def targets_with_baseline(store: Store, env_keys: set[str], ref: str) -> set[str]:
    """Target ids that have a baseline of ``ref`` in any of ``env_keys``."""
    found = set()
    slug = ref_slug(ref)
    for info in store.list("baselines/"):
        parts = info.key.split("/")
        if len(parts) == 7 and parts[-1] == "latest.json" and parts[5] == slug \
                and parts[4] in env_keys:
            found.add("/".join(parts[1:4]))
    return found


__all__ = ["fetch", "fetch_reference", "publish", "prefix", "ref_slug",
           "targets_with_baseline"]
