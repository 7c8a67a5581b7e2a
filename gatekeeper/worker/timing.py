"""Latency: warmup, then eager, compiled (and paired mode's base) timed in interleaved
rounds with device synchronisation, plus a fixed drift-reference workload."""

from __future__ import annotations

import math
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..boundary import breadcrumbs
from ..config import MeasureConfig
from ..gate import rounds, stats
from .calls import Inputs

SAMPLE_SECONDS = 0.002  # aim for at least this much work in one timing sample


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def first_call(
    compiled: Callable, inputs: Inputs, device: str, step: str = "first call"
) -> tuple[Any, float]:
    """One call's output and wall time (the first call of a compiled model is its
    compile); ``step``: what the worker is doing, should it die in there."""
    breadcrumbs.enter(step)
    sync(device)
    start = time.perf_counter()
    out = inputs.call(compiled)
    sync(device)
    return out, time.perf_counter() - start


class DriftReference:
    """A fixed workload (matmul + tanh) timed between the model's samples: dividing by it
    cancels much of the machine's drift between processes."""

    def __init__(self, device: str) -> None:
        gen = torch.Generator().manual_seed(1234)
        self.x = torch.randn(128, 128, generator=gen).to(device)
        self.w = (torch.randn(128, 128, generator=gen) / 12).to(device)

    def __call__(self) -> None:
        x = self.x
        for _ in range(4):
            x = torch.tanh(x @ self.w)


class CpuWatch:
    """How much CPU other processes took while we measured, and how much we took: the
    machine's busy time (/proc/stat) minus this process's and its children's, per second
    of wall time, in cores. On a quiet runner ``others`` stays near 0; another job on the
    cores shows at once. Whether it disturbed us depends on the cores left over
    (gate.drift: others + ours near the core count means threads waited for a core).
    A distributed target's rank counts its whole team as its own (``root``: the agent
    that started the ranks): its sibling ranks are the measurement, not a disturbance."""

    def __init__(self, root: int | None = None) -> None:
        self.root = root
        self.start = self._read()
        self.others: float | None = None
        self.own: float | None = None

    @staticmethod
    def _tree_cpu(ticks: int, root: int | None = None) -> float:
        """CPU seconds of this process's children (compile workers, ...), by /proc; with
        ``root``: that process's and all its descendants' instead."""
        parents: dict[int, list[tuple[int, int]]] = {}
        mine = 0
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                f = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # it ended meanwhile
                continue
            parents.setdefault(int(f[1]), []).append((int(p.name), int(f[11]) + int(f[12])))
            if int(p.name) == root:
                mine = int(f[11]) + int(f[12])
        total, stack = mine, [root or os.getpid()]
        while stack:
            for child, cpu in parents.get(stack.pop(), []):
                total += cpu
                stack.append(child)
        return total / ticks

    def _read(self) -> tuple[float, float, float] | None:
        try:
            fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        except OSError:
            return None
        ticks = os.sysconf("SC_CLK_TCK")
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
        busy = (user + nice + system + irq + softirq + steal) / ticks
        if self.root is not None:
            return time.perf_counter(), busy, self._tree_cpu(ticks, self.root)
        own = resource.getrusage(resource.RUSAGE_SELF)
        return time.perf_counter(), busy, own.ru_utime + own.ru_stime + self._tree_cpu(ticks)

    def stop(self) -> None:
        end = self._read()
        if self.start is None or end is None or end[0] <= self.start[0]:
            return
        wall = end[0] - self.start[0]
        own = end[2] - self.start[2]
        self.own = own / wall
        self.others = max(0.0, (end[1] - self.start[1] - own) / wall)


def _timed(fn: Callable[[], Any], loops: int, device: str, cpu: list[float] | None = None) -> float:
    """Wall seconds per call; ``cpu``: also this process's CPU seconds per call."""
    sync(device)
    start = time.perf_counter()
    cpu_start = time.process_time() if cpu is not None else 0.0
    for _ in range(loops):
        fn()
    sync(device)
    if cpu is not None:
        cpu.append((time.process_time() - cpu_start) / loops)
    return (time.perf_counter() - start) / loops


class _Alone:
    """One process: nothing to agree on (a distributed target's ranks use
    :class:`gatekeeper.worker.team.Team`)."""

    def max(self, value: float) -> float:
        return value

    def any(self, flag: bool) -> bool:
        return flag

    def barrier(self) -> None:
        pass


def time_limit(budget: MeasureConfig) -> float:
    """Seconds of timed rounds at most (paired, while the rounds cannot decide):
    ``max_time`` (three times ``min_time`` unless set), never less than ``min_time``."""
    limit = budget.max_time if budget.max_time is not None else 3 * budget.min_time
    return max(budget.min_time, limit)


def _loops(one_call: float) -> int:
    """Calls per sample: a power of two giving at least SAMPLE_SECONDS of work."""
    return min(2 ** max(0, math.ceil(math.log2(SAMPLE_SECONDS / one_call))), 4096)


def _round_order(names: list[str], k: int) -> list[str]:
    """The order of round ``k``. Alone, the order flips every round (E C R, R C E, ...):
    no model always runs first, right after the other's caches were warmed, or last.
    Paired, base and head take the first two places and swap them every round (B H E R,
    H B E R, ...): each sees exactly the neighbours the other sees. (Flipping the whole
    round put base after base every other round and the head always in the middle; the
    head then read about 2% slower than an identical base.)"""
    if "base" not in names:
        return names if k % 2 == 0 else names[::-1]
    pair = ["base", "compiled"] if k % 2 == 0 else ["compiled", "base"]
    return pair + [n for n in names if n not in pair]


def _round(
    fns: dict[str, Callable[[], Any]],
    n: int,
    loops: tuple[int, int],
    device: str,
    samples: dict[str, list[float]],
    cpu: dict[str, list[float]] | None,
) -> None:
    """Round ``n``: one sample of each function (``loops``: the model's calls per
    sample, the reference's)."""
    for name in _round_order(list(fns), n):
        count = loops[1] if name == "reference" else loops[0]
        samples[name].append(_timed(fns[name], count, device, cpu[name] if cpu else None))


def _enough(team: Any, budget: MeasureConfig, elapsed: float, n: int, half: int) -> bool:
    """``min_time`` has passed, with at least 5 rounds. The second half (``half``: the
    rounds before halfway ran) takes at least as many rounds as the first, however long
    a stalled round made the first: else one half's order effects outweigh the other's."""
    return bool(team.any(elapsed >= budget.min_time and n >= max(5, 2 * half)))


def _decided(
    team: Any,
    budget: MeasureConfig,
    elapsed: float,
    samples: dict[str, list[float]],
    decide_at: float,
) -> bool:
    """Paired, past ``min_time``: the rounds decide a slowdown against ``decide_at``
    (their interval does not straddle it), or :func:`time_limit` has passed."""
    undecided = not rounds.paired_decisive(
        samples["base"], samples["compiled"], threshold=decide_at
    )
    return not team.any(elapsed < time_limit(budget) and undecided)


def _warm_up(fns: dict[str, Callable[[], Any]], rounds: int) -> None:
    for _ in range(rounds):
        for fn in fns.values():
            fn()


def latency(
    eager: Callable[[], Any],
    compiled: Callable[[], Any],
    device: str,
    budget: MeasureConfig,
    base: Callable[[], Any] | None = None,
    halfway: Callable[[], Any] | None = None,
    decide_at: float | None = None,
) -> dict:
    """Warm up, then time eager, compiled and the reference interleaved (see
    :func:`_round_order`) until ``min_time`` seconds have passed or ``max_samples``
    rounds were taken. Paired with a threshold (``decide_at``), the rounds go on past
    ``min_time`` while the paired estimate's interval straddles it
    (:func:`gatekeeper.gate.rounds.paired_decisive`), up to :func:`time_limit`.

    In paired mode ``base`` (the base version, compiled) is timed in each round too,
    next to the head's compiled sample, so each (base, compiled) pair shares the
    machine's state of that moment. ``halfway`` runs once, when half the time or half
    the rounds are taken (paired: both sides compiled again, in the other order), and
    every function is warmed up again after it; its seconds do not count as timed. The
    rounds after it are at least as many as those before it."""
    from .team import current

    # a distributed target's ranks agree on the loops, the rounds and when to stop,
    # and start every round together: its sample is then the slowest rank's
    team: Any = current() or _Alone()
    ref = DriftReference(device)
    fns: dict[str, Callable[[], Any]] = {"eager": eager, "compiled": compiled, "reference": ref}
    if base is not None:
        fns = {"base": base, **fns}
    _warm_up(fns, budget.warmup)
    one = max(max(_timed(fn, 1, device) for name, fn in fns.items() if name != "reference"), 1e-7)
    loops = _loops(team.max(one))
    # same sample length as the model's
    ref_loops = _loops(team.max(max(_timed(ref, 1, device), 1e-7)))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] | None = None
    if not isinstance(team, _Alone):
        cpu = {name: [] for name in fns}
    watch = CpuWatch(None if isinstance(team, _Alone) else os.getppid())
    start = time.perf_counter()
    half = 0  # rounds taken before halfway ran
    while len(samples["eager"]) < budget.max_samples:
        n, elapsed = len(samples["eager"]), time.perf_counter() - start
        done = _enough(team, budget, elapsed, n, half)
        if done and base is not None and decide_at is not None and halfway is None:
            done = _decided(team, budget, elapsed, samples, decide_at)
        if halfway is not None and team.any(
            done or elapsed >= budget.min_time / 2 or n >= budget.max_samples // 2
        ):
            half, done = n, False
            paused = time.perf_counter()
            halfway()
            halfway = None
            _warm_up(fns, budget.warmup)
            start += time.perf_counter() - paused
        if done:
            break
        team.barrier()
        _round(fns, n, (loops, ref_loops), device, samples, cpu)
    watch.stop()
    return latency_doc(samples, loops, watch, start, cpu)


def latency_doc(
    samples: dict[str, list[float]],
    loops: int,
    watch: CpuWatch,
    start: float,
    cpu: dict[str, list[float]] | None = None,
) -> dict:
    """The timed rounds as ``results.Latency``'s fields (and ``cpu``, a distributed
    target's, which the worker takes apart): summaries, speedup, every sample, and how
    disturbed the machine was (``watch`` stopped; ``start``: when the rounds began)."""
    e, c = stats.summary_doc(samples["eager"]), stats.summary_doc(samples["compiled"])
    return {
        "eager": e,
        "compiled": c,
        "reference": stats.summary_doc(samples["reference"]),
        "speedup": e["p50"] / c["p50"],
        "throughput": 1.0 / c["p50"],
        "inner_loops": loops,
        "samples": samples,
        "cpu": cpu,
        "disturbance": {
            "others_cores": watch.others,
            "own_cores": watch.own,
            "cores": os.cpu_count() or 1,
            "reference_noise": stats.noise(samples["reference"]),
            "seconds": time.perf_counter() - start,
        },
    }
