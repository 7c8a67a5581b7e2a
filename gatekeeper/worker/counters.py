"""Deterministic work counters: what a call does, not how long it took, so they do not
drift between processes and gate with a single stored baseline run.

* FLOPs per eager call (``FlopCounterMode``; shape-only, identical in every process).
  CPU attention (``_scaled_dot_product_flash_attention_for_cpu``) has no formula in
  torch, so one is supplied.
* Inductor's generated kernel count and estimated bytes accessed
  (``torch._inductor.metrics``). Bytes are only computed while the ``inductor_metrics``
  log artifact is on at the cold compile; the FX graph cache stores the deltas and
  replays them on every hit. :func:`record_inductor_metrics` turns the artifact on
  quietly, in every worker that compiles, so bundles carry them. An entry written without
  it replays 0 bytes forever, so 0 bytes reads as unknown (None).
* The user-space instruction count of one compiled call (``torch._C._instruction_counter``,
  perf_event_open); ``"unavailable"`` where the kernel refuses it (VMs, containers).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

_METRICS_LOGGER = "torch._inductor.compile_fx.__inductor_metrics"


def record_inductor_metrics() -> None:
    """Make inductor compute bytes accessed at compile time, without printing them."""
    log = logging.getLogger(_METRICS_LOGGER)
    log.setLevel(logging.INFO)
    log.propagate = False
    if not any(isinstance(h, logging.NullHandler) for h in log.handlers):
        log.addHandler(logging.NullHandler())


def reset_inductor_metrics() -> None:
    from torch._inductor import metrics

    metrics.reset()


def inductor_metrics() -> dict[str, int | None]:
    """Kernels generated and bytes accessed by everything compiled since the last reset
    (a cache hit replays what its cold compile recorded)."""
    from torch._inductor import metrics

    nbytes = int(metrics.num_bytes_accessed)
    return {
        "kernels": int(metrics.generated_kernel_count),
        "bytes_accessed": nbytes if nbytes > 0 else None,
    }


def _cpu_attention_flops() -> dict:
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten
    mapping: dict = {}
    fwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    bwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if fwd is not None:
        mapping[fwd] = lambda q, k, v, *a, out_shape=None, **kw: sdpa_flop_count(q, k, v)
    if bwd is not None:
        mapping[bwd] = lambda g, q, k, v, *a, out_shape=None, **kw: sdpa_backward_flop_count(
            g, q, k, v
        )
    return mapping


def flops(fn: Callable[[], Any]) -> int | None:
    """Floating-point operations of one call of ``fn`` (run it eagerly)."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with FlopCounterMode(display=False, custom_mapping=_cpu_attention_flops()) as fc:
            fn()
    except Exception:  # an op the counter cannot follow: say unknown, measure the rest
        return None
    return int(fc.get_total_flops())


def instructions(fn: Callable[[], Any]) -> int | str:
    """User-space instructions retired by one call of ``fn``, or ``"unavailable"``."""
    counter = getattr(torch._C, "_instruction_counter", None)
    if counter is None:
        return "unavailable"
    handle = counter.start()
    if handle is None or handle < 0:
        return "unavailable"
    fn()
    count = counter.end(handle)
    return "unavailable" if count >= 2**63 else int(count)
