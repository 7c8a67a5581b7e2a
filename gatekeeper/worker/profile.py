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
SESSION = 2  # calls profiled in one profiler session (profile_calls)
COMPILED_GRAPH = "inductor kernels (compiled graph)"
_GRAPH_ROW = re.compile(r"^## Call CompiledFxGraph \S+ ##$")


def _name(key: str) -> str:
    return COMPILED_GRAPH if _GRAPH_ROW.match(key) else key


def profile_calls(
    fn: Callable[[], Any], device: str, *, calls: int = 20, trace: str | None = None
) -> dict:
    """Profile ``calls`` calls of ``fn``: the top operators by self time per call
    (microseconds) and how often each ran per call; the Chrome trace of the first
    :data:`SESSION` calls to ``trace``.

    The calls are profiled :data:`SESSION` at a time, each session's events summed and
    dropped, and the heap's free pages handed back before the next: the profiler's
    record of a call grows the resident set with the call's operators (about 10 MB a
    call of a 24-layer Qwen2-0.5B on CPU), and 20 calls in one session stood 0.2 GB
    above the timed rounds, the highest point of that model's check; five a session,
    0.04 GiB, still its highest once its outputs and float64 logits lay in files
    (docs/scale.md)."""
    from torch.profiler import ProfilerActivity, profile

    from .memory import give_back

    activities = [ProfilerActivity.CPU]
    cuda = device.startswith("cuda")
    if cuda:
        activities.append(ProfilerActivity.CUDA)
    fn()
    sync(device)
    totals: dict[str, list[float]] = {}
    for start in range(0, calls, SESSION):
        with profile(activities=activities) as prof:
            for _ in range(min(SESSION, calls - start)):
                fn()
            sync(device)
        if trace and start == 0:
            prof.export_chrome_trace(trace)
        for e in prof.key_averages():
            device_us = getattr(e, "self_device_time_total", 0) if cuda else 0
            self_us = device_us or e.self_cpu_time_total
            if self_us <= 0:
                continue
            row = totals.setdefault(_name(e.key), [0.0, 0.0])
            row[0] += self_us
            row[1] += e.count
        del prof
        give_back()
    top = sorted(totals.items(), key=lambda kv: -kv[1][0])[:TOP]
    ops = [{"name": k, "self_us": v[0] / calls, "count": v[1] / calls} for k, v in top]
    return {"calls": calls, "device_time": cuda, "ops": ops}
