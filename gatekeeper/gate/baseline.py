"""Publishing results as a branch's baseline: each target's result, with the noise
figures of its recent history (gate.drift), written through store.baselines."""

from __future__ import annotations

from pathlib import Path

from ..bundle import now_iso
from ..errors import GatekeeperError
from ..inside import contained
from ..results import Baseline, Results, TargetResult
from ..store import Store, baselines
from .drift import HISTORY_FOR_NOISE, measure_noise


def publish_result(
    store: Store,
    result: TargetResult,
    *,
    ref: str,
    commit: str | None,
    reference_file: Path | None = None,
    verdict: str | None = None,
) -> str:
    """Publish one target's result as the baseline of ``ref``: ``published``, ``older``
    or ``skipped`` (see store.baselines.publish)."""
    if result.status != "ok" or result.measured_at is None:
        raise GatekeeperError(f"{result.target}: cannot publish a failed measurement as a baseline")
    key = baselines.BaselineKey(result.target, result.env_key, ref)
    recent = [d.result for d in baselines.history(store, key, HISTORY_FOR_NOISE)]
    doc = Baseline(
        target=result.target,
        env_key=result.env_key,
        ref=ref,
        commit=commit,
        created_at=result.measured_at,
        published_at=now_iso(),
        result=result,
        noise=measure_noise(result, recent),
        verdict=verdict,
    )
    return baselines.publish(store, key, doc, reference_file)


def publish_results(
    results: Results,
    results_dir: Path,
    store: Store,
    ref: str,
    verdicts: dict[str, str] | None = None,
) -> list[dict]:
    """Publish every measured target of ``results``; one row per target. ``verdicts``:
    what the gate said of each target against the previous baseline (``run --publish``),
    kept in the document for the dashboard."""
    rows = []
    commit = results.creator.get("commit")
    for r in results.targets:
        if r.status != "ok":
            rows.append({"target": r.target, "status": "error", "error": r.error})
            continue
        ref_file = (
            contained(results_dir, r.reference.file, f"{r.target}: reference.file")
            if r.reference
            else None
        )
        status = publish_result(
            store,
            r,
            ref=ref,
            commit=commit,
            reference_file=ref_file if ref_file and ref_file.is_file() else None,
            verdict=(verdicts or {}).get(r.target),
        )
        rows.append({"target": r.target, "status": status, "env_key": r.env_key})
    return rows
