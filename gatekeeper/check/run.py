"""Every target of a ``check`` run, one worker each, in the mode chosen (paired: the base
commit checked out beside this one), and the results document."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from .. import __version__, distributed
from ..boundary import box
from ..bundle import now_iso
from ..config import Config
from ..errors import ConfigError
from ..key import refuse_unrunnable
from ..progress import Progress
from ..provenance import creator
from ..results import Results
from ..store import Store
from ..targets import Target
from .paired import Mode, PairedBase, base_config, checkout
from .target import Plan, check_target

log = logging.getLogger("gatekeeper.check")


def check_all(targets: list[Target], config: Config, store: Store, plan: Plan) -> Results:
    """Measure ``targets`` as ``plan`` says, in its mode (see
    :func:`gatekeeper.check.paired.choose_mode`). Paired, the base side of each target
    is the base commit's own definition of it, from the base commit's config; a base
    config that does not load is one line, and the run is measured in stored mode
    instead."""
    refuse_unrunnable(targets)  # a quantized config this machine cannot run: one line
    mode = plan.mode
    sys.stderr.write(f"gatekeeper: {mode.reason}\n")
    results, removed = None, []
    if mode.name == "paired":
        with checkout(mode.base_commit, config.base_dir) as base_dir:
            try:
                paired = PairedBase.of(mode, base_dir, base_config(config, base_dir))
            except ConfigError as e:
                mode = Mode("stored", f"stored mode: {e}")
                sys.stderr.write(f"gatekeeper: {mode.reason}\n")
            else:
                removed = paired.removed(config)
                results = _check_all(targets, config, store, plan, paired)
    if results is None:
        results = _check_all(targets, config, store, plan, None)
    results.shard = plan.shard
    results.mode, results.mode_reason = mode.name, mode.reason
    results.removed = removed
    return results


def _runnable_others() -> int | None:
    """Processes other than this one wanting a CPU right now (least of a few looks)."""
    counts = []
    for _ in range(5):
        try:
            text = Path("/proc/stat").read_text()
        except OSError:
            return None
        running = next(
            (int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("procs_running")), None
        )
        if running is None:
            return None
        counts.append(running - 1)
        time.sleep(0.05)
    return min(counts)


def warn_if_busy() -> None:
    """Timings on a busy machine are noise: torch's OpenMP threads wait at every barrier
    for a thread the OS has descheduled (a 30 µs op became 4 ms on 2 busy cores here)."""
    others, cores = _runnable_others(), os.cpu_count() or 1
    if others:
        log.warning(
            "%d other process(es) are using the CPU (%d cores): latency will be "
            "noisy; run one measurement per runner at a time",
            others,
            cores,
        )


def _check_all(
    targets: list[Target], config: Config, store: Store, plan: Plan, paired: PairedBase | None
) -> Results:
    warn_if_busy()
    progress = Progress(len(targets))
    results = []
    for target in targets:
        with progress.step(target.id, "measuring" + (" paired" if paired else "")) as step:
            r = check_target(target, config, store, plan, paired)
            results.append(r)
            if r.status in ("not-exportable", "unavailable"):
                step.done(str(r.error))
            elif r.latency is None or r.compile is None:
                step.done(f"error: {r.error}")
            else:
                step.done(
                    f"p50 {r.latency.compiled.p50 * 1e3:.3f} ms, "
                    f"speedup {r.latency.speedup:.2f}x, cache {r.compile.cache}"
                    + (f"; {distributed.spread(r.ranks)}" if r.ranks else "")
                )
    return Results(
        created_at=now_iso(),
        gatekeeper_version=__version__,
        creator=creator(),
        base_ref=plan.base_ref,
        targets=results,
        unconfined=box.unconfined() or None,  # what the runner's owner let run without one
    )
