"""Where a compiled call spends its time: ``torch.profiler`` over a few calls, summed by
operator (self time per call), plus a Chrome trace for the Action to upload.

On CPU inductor's fused C++ kernels run inside one profiler row per compiled graph,
``## Call CompiledFxGraph <cache key> ##``, whose key changes with the code: those rows
are summed under one name, ``inductor kernels (compiled graph)``, so base and head
compare. On CUDA each Triton kernel is its own row (device time).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .timing import sync

TOP = 25  # operators kept per profile
COMPILED_GRAPH = "inductor kernels (compiled graph)"
_GRAPH_ROW = re.compile(r"^## Call CompiledFxGraph \S+ ##$")


def _name(key: str) -> str:
    return COMPILED_GRAPH if _GRAPH_ROW.match(key) else key


def profile_calls(
    fn: Callable[[], Any], device: str, *, calls: int = 20, trace: str | None = None
) -> dict:
    """Profile ``calls`` calls of ``fn``: the top operators by self time per call
    (microseconds) and how often each ran per call; the Chrome trace to ``trace``."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    cuda = device.startswith("cuda")
    if cuda:
        activities.append(ProfilerActivity.CUDA)
    fn()
    sync(device)
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        sync(device)
    if trace:
        prof.export_chrome_trace(trace)
    totals: dict[str, list[float]] = {}
    for e in prof.key_averages():
        device_us = getattr(e, "self_device_time_total", 0) if cuda else 0
        self_us = device_us or e.self_cpu_time_total
        if self_us <= 0:
            continue
        row = totals.setdefault(_name(e.key), [0.0, 0.0])
        row[0] += self_us / calls
        row[1] += e.count / calls
    top = sorted(totals.items(), key=lambda kv: -kv[1][0])[:TOP]
    ops = [{"name": k, "self_us": v[0], "count": v[1]} for k, v in top]
    return {"calls": calls, "device_time": cuda, "ops": ops}
