"""Peak memory of a call: the CUDA allocator's peak, or on CPU the peak of live bytes
allocated during the call, from the profiler's memory events.

The CPU figure used to be the growth of the process's peak resident set; that
high-water mark was already raised by importing torch and compiling, so a call never
moved it and every target read 0 MiB. torch has no CPU allocator statistics, but the
profiler records each allocation and free (``profile_memory=True``): walked in time
order, their running sum peaks at the most bytes the call held at once.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

#: the last-level cache assumed where the machine does not say
DEFAULT_CACHE = 32 << 20
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def last_level_cache(device: str) -> int:
    """Bytes of the device's last-level cache: a GPU's L2, the CPU's largest cache as
    Linux lists it (``/sys/devices/system/cpu/cpu0/cache``), else DEFAULT_CACHE."""
    if device.startswith("cuda"):
        return int(torch.cuda.get_device_properties(device).L2_cache_size) or DEFAULT_CACHE
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip()
        try:
            sizes.append(int(text[:-1]) * _UNITS[text[-1]] if text[-1] in _UNITS else int(text))
        except (ValueError, IndexError):
            continue
    return max(sizes, default=DEFAULT_CACHE)


def allocated(device: str, cuda: Any = None) -> int:
    """Bytes the CUDA allocator holds for tensors now (0 on CPU). ``cuda``: the
    allocator's statistics, ``torch.cuda`` unless given (see :func:`peak_memory`)."""
    if device.startswith("cuda"):
        cuda = torch.cuda if cuda is None else cuda
        cuda.synchronize()
        return cuda.memory_allocated()
    return 0


_cuda_high = [0]  # the CUDA allocator's peak before peak_memory last reset it


def process_peak(device: str) -> int | None:
    """The most bytes this process has held: the CUDA allocator's peak on a GPU (over
    every reset :func:`peak_memory` made), else the peak resident set (torch's own
    libraries and compiled code included)."""
    if device.startswith("cuda"):
        return max(_cuda_high[0], int(torch.cuda.max_memory_allocated()))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux


def give_back() -> None:
    """Hand the heap's free pages back to the kernel (glibc's ``malloc_trim``) between
    the steps of a measurement: what a model's build, ``explain`` or a compile freed
    stays resident otherwise, and the next step's peak stands on it (docs/scale.md).
    Where the C library has no ``malloc_trim`` (musl, macOS), nothing."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def footprint(memory: dict, model: object, device: str, built: int | None = None) -> dict:
    """``memory`` with the process's peak as a multiple of the model's weight bytes
    (parameters and buffers, :func:`gatekeeper.worker.fp64.weight_bytes`), and ``built``
    (:func:`process_peak` read once the factory returned, before anything compiled: the
    imports' and the factory's own, which a stock model's build can hold above its
    weights) the same way: the difference is what the measurement added."""
    from .fp64 import weight_bytes

    weights, peak = weight_bytes(model), process_peak(device)

    def times(n: int | None) -> float | None:
        return round(n / weights, 3) if weights and n else None

    return {
        **memory,
        "weight_bytes": weights or None,
        "process_peak_bytes": peak,
        "peak_x_weights": times(peak),
        "build_peak_bytes": built,
        "build_peak_x_weights": times(built),
    }


def peak_memory(fn: Callable[[], Any], device: str, held: int = 0, cuda: Any = None) -> int | None:
    """Bytes allocated at the peak of one call of ``fn`` (beyond what was live before),
    or ``held`` if more: what a compiled model keeps allocated between calls (a CUDA
    graph's memory pool is filled when it records, so its replays allocate nothing);
    None when it cannot be measured here. ``cuda``: the CUDA allocator's statistics
    (``synchronize``, ``reset_peak_memory_stats``, ``memory_allocated``,
    ``max_memory_allocated``), ``torch.cuda`` unless given: readings recorded on a real
    GPU stand in for it on a machine without one (tests/test_cuda_facts.py)."""
    if device.startswith("cuda"):
        cuda = torch.cuda if cuda is None else cuda
        cuda.synchronize()
        _cuda_high[0] = max(_cuda_high[0], int(cuda.max_memory_allocated()))
        cuda.reset_peak_memory_stats()
        before = cuda.memory_allocated()
        for _ in range(3):
            fn()
        cuda.synchronize()
        return max(cuda.max_memory_allocated() - before, held)
    from .team import current

    if current() is not None:  # a rank: no profiler beside gloo's threads (worker.task)
        return None
    try:
        return _cpu_peak(fn)
    except Exception:  # a profiler that cannot run here: say unknown, never 0
        return None


def _cpu_peak(fn: Callable[[], Any]) -> int | None:
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        if e.tag == _EventType.Allocation and e.extra_fields.device.type == "cpu":
            events.append((e.start_time_ns, e.extra_fields.alloc_size))  # + alloc, - free
        stack.extend(e.children)
    if not events:
        return None
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return peak
