"""A plan before the work: will the target fit in memory? Before the worker builds the
model (its factory run with every tensor on the meta device, where it can be:
:func:`gatekeeper.worker.model.on_meta`, so a model too big is refused before its
weights exist) and again right after the build, before anything compiles, the peak is
estimated from the model's weight bytes (its parameters and buffers in their own
dtypes, a tied weight once), the mode and the task, and compared with the memory given
(``GATEKEEPER_MEMORY_LIMIT``, the request's ``memory_limit``) or, without one, with what
the device can still give (:func:`available`). A target that will not fit is refused
in one line (:class:`WontFit`) naming the estimate and the ways out.

What the estimate counts, in multiples of the weights ``W``: the model itself (1); in
paired mode the base commit's model (1 more) and, while the weights are small enough
for cache warmth to matter, eager's copy of them
(:func:`gatekeeper.worker.measure.eager_model`); a training step's eager and compiled
copies, each with its gradients and the optimizer's state (Adam's two moments: 4 per
copy); and the float64 reference's largest module in float64. Activations are not
known before a call and are not counted; neither is torch's own runtime (the limit is
on what the model costs)."""

from __future__ import annotations

import resource
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import units
from ..boundary import breadcrumbs
from ..boundary.protocol import Build
from .fp64 import running_bytes, weight_bytes
from .memory import last_level_cache

__all__ = ["Estimate", "WontFit", "before_build", "check_fits", "estimate", "fits"]

# optimizer state per parameter byte, by torch.optim class (the rest: Adam's)
_STATE = {"SGD": 1.0, "Adagrad": 1.0, "RMSprop": 1.0, "Adam": 2.0, "AdamW": 2.0}


class WontFit(Exception):
    """The target will not fit in the memory given: one line, before any compile."""


@dataclass(frozen=True)
class Estimate:
    weights: int  # bytes of the model's parameters and buffers
    copies: float  # the weights' multiples held at the peak
    fp64_layer: int  # the float64 reference's largest module, in float64
    why: str  # what the copies are

    @property
    def peak(self) -> int:
        return int(self.weights * self.copies) + self.fp64_layer


def _largest_layer_fp64(model: object) -> int:
    """Bytes of the largest module's own floating tensors in float64 while it runs (a
    large linear layer's: one block, :data:`gatekeeper.worker.fp64.BLOCK`)."""
    if not isinstance(model, nn.Module):
        return 0
    return max((running_bytes(m) for m in model.modules()), default=0)


def estimate(
    model: object, device: str, *, paired: bool, trainers: int = 0, optimizer: str = "Adam"
) -> Estimate:
    """The peak this target's work holds besides torch's runtime and activations;
    ``trainers``: a training target's copies of the model, each with its gradients and
    optimizer state (a compile's one, a measurement's two: eager and compiled)."""
    w = weight_bytes(model)
    copies, why = 1.0, ["the model"]
    if trainers:
        copies += trainers * (2 + _STATE.get(optimizer, 2.0))
        why.append(f"{trainers} training copies with gradients and {optimizer} state")
    if paired:
        copies *= 2
        why.append("paired: the base commit's beside it")
        if not trainers and w <= 2 * last_level_cache(device):
            copies += 1
            why.append("eager's copy (weights within the cache)")
    return Estimate(w, copies, 0 if trainers else _largest_layer_fp64(model), ", ".join(why))


def fits(
    model: object, req: Build, *, paired: bool = False, trainers: int = 0, built: bool = True
) -> None:
    """Refuse (:class:`WontFit`) a target whose work will not fit; see the module
    docstring. Runs before the build on the factory's model on the meta device
    (``built`` false: :func:`gatekeeper.worker.model.on_meta`), and again right after
    the build, before anything compiles. Before the build a quantized target counts
    only its float model (what is built before it is quantized)."""
    breadcrumbs.enter("plan")
    if not built and req.quantize != "none":
        w = weight_bytes(model)
        est = Estimate(w, 1.0, 0, f"the float model, built before {req.quantize}")
    else:
        optimizer = req.model.training.optimizer
        est = estimate(model, req.device, paired=paired, trainers=trainers, optimizer=optimizer)
    check_fits(est, req.device, req.memory_limit, paired=paired, built=built)


def before_build(req: Build, *, paired: bool = False, trainers: int = 0) -> Callable[[Any], None]:
    """:func:`fits` of the model the factory builds on the meta device, for
    :func:`gatekeeper.worker.model.build_recorded`'s ``plan``."""
    return lambda meta: fits(meta, req, paired=paired, trainers=trainers, built=False)


def available(device: str) -> tuple[int, str] | None:
    """Bytes the device can still give, and what says so: the GPU's free memory; on a
    CPU the least of the kernel's ``MemAvailable``, what the address-space limit
    (``ulimit -v``) leaves this process and what its cgroup's ``memory.max`` leaves it;
    None where none can be read."""
    if device.startswith("cuda"):
        return int(torch.cuda.mem_get_info(torch.device(device))[0]), f"{device} has"
    found: list[tuple[int, str]] = []
    status = _fields(Path("/proc/meminfo"), "MemAvailable")
    if "MemAvailable" in status:
        found.append((status["MemAvailable"], "the machine has"))
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft != resource.RLIM_INFINITY:
        size = _fields(Path("/proc/self/status"), "VmSize").get("VmSize", 0)
        found.append((max(0, soft - size), "the address-space limit (ulimit -v) leaves"))
    cgroup = _cgroup_left()
    if cgroup is not None:
        found.append((cgroup, "the cgroup's memory.max leaves"))
    return min(found) if found else None


def _fields(path: Path, *names: str) -> dict[str, int]:
    """``Name: <n> kB`` lines of a /proc file, in bytes."""
    out = {}
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(":")
            if key in names:
                out[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def _cgroup_left() -> int | None:
    """What this process's cgroup (v2) may still take: ``memory.max`` less
    ``memory.current``; None without a limit or a cgroup v2."""
    try:
        rel = next(
            ln.split("::", 1)[1]
            for ln in Path("/proc/self/cgroup").read_text().splitlines()
            if ln.startswith("0::")
        )
        folder = Path("/sys/fs/cgroup") / rel.strip().lstrip("/")
        limit = (folder / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((folder / "memory.current").read_text()))
    except (OSError, ValueError, StopIteration):
        return None


def check_fits(
    est: Estimate, device: str, limit: int | None, *, paired: bool, built: bool = True
) -> None:
    """Raise :class:`WontFit` where ``est`` exceeds ``limit`` (the whole estimate) or,
    without one, what the device can still give (:func:`available`: what it needs
    beyond the model where the model is ``built`` already, else all of it)."""
    if limit is not None:
        need, given = est.peak, f"GATEKEEPER_MEMORY_LIMIT gives {units.size(limit)}"
        have = limit
    else:
        free = available(device)
        if free is None:
            return
        have, says = free
        need = est.peak - est.weights if built else est.peak
        given = f"{says} {units.size(have)} free" + (" besides the model" if built else "")
    if need <= have:
        return
    outs = ["raise GATEKEEPER_MEMORY_LIMIT" if limit is not None else "a device with more memory"]
    if paired:
        outs.insert(0, "check one side (--mode stored: no base model beside it)")
    outs.append("split the model over tensor parallel ranks (the model's distributed setting)")
    parts = [f"{est.copies:g} x {units.size(est.weights)} of weights ({est.why})"]
    if est.fp64_layer:
        parts.append(f"{units.size(est.fp64_layer)} for the float64 reference's largest layer")
    when = "not started" if built else "not built (planned on the meta device)"
    raise WontFit(
        f"needs about {units.size(est.peak)}: {' + '.join(parts)}, plus activations; "
        f"{given}: {when}; ways out: {'; '.join(outs)}"
    )
