"""Distributed targets, parent side (no torch): what their bundles record of each rank,
the warm rule that keeps ranks from splitting, and which rank a slowdown is on.

* **Bundle**: the ranks of a node compile into one cache dir (torch's default). The
  manifest's ``compile.distributed`` says which of its files every rank used
  (``shared``) and which only some did (``ranks``: by rank). Files are told apart by
  their path, which inductor derives from the cache key: two ranks' entries for one key
  are interchangeable even though their bytes never match (each embeds its process's
  environment and timings).
* **Warm**: all ranks hit or all miss, never a split: one rank compiling while another
  starts from the cache waits in the first collective for the whole compile, or, with a
  compile-time collective (inductor's ``spmd_check``, overlap scheduling), hangs. A
  bundle that lacks any rank's record is not restored (:func:`would_split`); what the
  ranks then hit is reported per rank, and a mixed first call is ``partial``.
* **Gate**: a distributed step is as fast as its slowest rank; a regression names the
  rank whose CPU time per call rose most (the other ranks only wait for it inside a
  collective, which costs wall time, not CPU).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .boundary.protocol import Response
    from .results import RankResult, TargetResult
    from .targets import Target


def manifest_section(target: Target, resp: Response) -> dict[str, Any]:
    """``compile.distributed`` of a distributed target's bundle ({} for another)."""
    d = target.model.distributed
    if d is None or not resp.ranks:
        return {}
    used = [set(r.cache_used or ()) for r in resp.ranks]
    shared = set.intersection(*used) if used else set()
    return {
        "distributed": {
            **d.spec(),
            "shared": sorted(shared),
            "ranks": {
                str(r.rank): sorted(u - shared) for r, u in zip(resp.ranks, used, strict=True)
            },
            "fxgraph_cache_hit": {str(r.rank): r.fxgraph_cache_hit for r in resp.ranks},
            "seconds": {str(r.rank): r.compile_seconds for r in resp.ranks},
        }
    }


def would_split(manifest: Any, target: Target) -> str | None:
    """Why restoring this bundle could leave one rank warm and another cold (None: it
    cannot): a distributed bundle without every rank's record, or one where a rank
    compiled nothing from its files."""
    d = target.model.distributed
    if d is None:
        return None
    info = manifest.compile.get("distributed")
    if not isinstance(info, dict):
        return "the bundle records no ranks: restoring it could warm one rank and not another"
    ranks = info.get("ranks") or {}
    shared = info.get("shared") or []
    for rank in range(d.world_size):
        if str(rank) not in ranks:
            return f"the bundle has no record of rank {rank}: all ranks compile cold"
        if not shared and not ranks[str(rank)]:
            return f"rank {rank} used no file of the bundle: all ranks compile cold"
    return None


def split_note(resp: Response) -> str:
    """A first call's per-rank cache outcome: ``""`` when every rank hit or every rank
    missed, else which ranks missed."""
    if not resp.ranks:
        return ""
    missed = [r.rank for r in resp.ranks if r.fxgraph_cache_miss and not r.fxgraph_cache_hit]
    hit = [r.rank for r in resp.ranks if r.fxgraph_cache_hit]
    if missed and hit:
        return f", split: rank {', '.join(map(str, missed))} compiled while the others hit"
    return ""


def _ratio(new: float | None, old: float | None) -> float | None:
    return new / old - 1 if new and old else None


def slow_rank(result: TargetResult, baseline: TargetResult | None = None) -> str | None:
    """Which rank a slowdown is on: ``rank 1: CPU per call +212% (rank 0 +3%)``, by each
    rank's CPU time against the paired base's, else against the baseline's ranks."""
    ranks = result.ranks or []
    base: dict[int, float | None] = {r.rank: r.base_cpu_p50 for r in ranks}
    if not any(base.values()) and baseline is not None and baseline.ranks:
        base = {r.rank: r.cpu_p50 for r in baseline.ranks}
    rises = {r.rank: _ratio(r.cpu_p50, base.get(r.rank)) for r in ranks}
    found = {k: v for k, v in rises.items() if v is not None}
    if len(found) < 2:
        return None
    worst = max(found, key=lambda k: found[k])
    others = ", ".join(f"rank {k} {v:+.0%}" for k, v in found.items() if k != worst)
    return f"rank {worst}: CPU per call {found[worst]:+.0%} ({others})"


def spread(ranks: list[RankResult]) -> str:
    """The per-rank medians in one line: ``rank 0 1.02 ms (CPU 0.61), rank 1 ...``."""
    parts = []
    for r in ranks:
        if r.latency_p50 is None:
            continue
        cpu = f" (CPU {r.cpu_p50 * 1e3:.3f})" if r.cpu_p50 is not None else ""
        parts.append(f"rank {r.rank} {r.latency_p50 * 1e3:.3f} ms{cpu}")
    return ", ".join(parts)
