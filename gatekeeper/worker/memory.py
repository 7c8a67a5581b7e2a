"""Peak memory of a call: the CUDA allocator's peak, or the resident set's on CPU."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch


def _rss_bytes(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_memory(fn: Callable[[], Any], device: str) -> int | None:
    """Peak memory while running ``fn`` a few times: CUDA allocator peak, else growth of
    the peak resident set (VmHWM, reset through /proc/self/clear_refs)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    before = _rss_bytes("VmRSS")
    for _ in range(3):
        fn()
    peak = _rss_bytes("VmHWM")
    return None if before is None or peak is None else max(0, peak - before)
