"""The judge: fetch each target's baseline from the store, gate every result under the
rules that govern it (gate.rules, gate.governing), and build the report."""

from __future__ import annotations

import fnmatch
import logging

from ..config import Config
from ..errors import StoreError
from ..project import expand
from ..results import Baseline, Results
from ..store import Store, baselines
from ..store.base import store_error
from .rules import GateReport, build_report

log = logging.getLogger("gatekeeper.gate")
TREND_RUNS = 10  # the base branch's last baselines shown as a trend per target


def judge(
    results: Results,
    config: Config,
    store: Store,
    *,
    base_ref: str,
    require_baseline: bool = False,
    accept: list[str] | None = None,
) -> GateReport:
    """Gate every result against its baseline of ``base_ref``. ``accept``: globs of
    target ids whose regression the pull request accepts on purpose (``accepted``).

    "no-baseline" means the store answered that there is none. A store that cannot be
    read (a missing bucket, bad credentials, an unreachable endpoint, a document that is
    not a baseline) raises StoreError instead: gating as if there were no baseline would
    pass every pull request.
    """
    found: dict[str, Baseline | None] = {}
    try:
        for r in results.targets:
            if r.base_target is not None and not r.base_target.defined:
                found[r.target] = None  # new in this change: nothing of the base's
                continue
            found[r.target] = baselines.fetch(
                store, baselines.BaselineKey(r.target, r.env_key, base_ref)
            )
        with_baseline = baselines.targets_with_baseline(
            store, {r.env_key for r in results.targets}, base_ref
        )
    except StoreError as e:
        raise store_error(store.uri, e, f"cannot read the baselines of {base_ref}") from e
    measured = {r.target for r in results.targets}
    defined = {t.id for t in expand(config)}
    models = {m.name: m for m in config.models}

    def rules_for(target_id: str):  # the change's own (the base's govern: gate.governing)
        model = models.get(target_id.split("/")[0])
        return config.gate_for(model) if model else config.gate

    report = build_report(
        results.targets,
        found,
        rules_for,
        base_ref=base_ref,
        # stored: baselines of targets this change's config no longer defines (one it
        # defines and this run left out, by --target or --shard, is not removed);
        # paired: the base commit's targets that this change's config no longer defines
        removed=sorted((with_baseline - measured - defined) | set(results.removed)),
        require_baseline=require_baseline,
        creator=results.creator,
        accepted=lambda t: any(fnmatch.fnmatchcase(t, g) for g in accept or []),
    )
    report.mode_reason = results.mode_reason
    report.unconfined = list(results.unconfined or [])
    for row in report.rows:  # the base branch's trend, for the report's sparkline
        if row.baseline is not None:
            try:
                key = baselines.BaselineKey(row.result.target, row.result.env_key, base_ref)
                row.history = [d.result for d in baselines.history(store, key, TREND_RUNS)]
            except StoreError as e:  # the verdict stands; only the picture is missing
                log.warning("%s: no trend: %s", row.result.target, e)
    return report
