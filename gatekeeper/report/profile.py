"""Where the time went: the top operators of the base and of this run, by the change in
their self time per call. Pure: no I/O, no torch."""

from __future__ import annotations

from dataclasses import dataclass

from ..results import Profile

SHOWN = 10


@dataclass(frozen=True)
class OpChange:
    name: str
    base_us: float  # self time per call, microseconds
    pr_us: float

    @property
    def delta_us(self) -> float:
        return self.pr_us - self.base_us

    @property
    def ratio(self) -> float | None:
        return self.pr_us / self.base_us - 1 if self.base_us > 0 else None

    def describe(self) -> str:
        """``aten::mm +0.41 ms/call, +38%``."""
        d = self.delta_us
        amount = f"{d / 1000:+.2f} ms/call" if abs(d) >= 100 else f"{d:+.1f} µs/call"
        rel = f", {self.ratio:+.0%}" if self.ratio is not None else " (new)"
        return f"{self.name} {amount}{rel}"


def diff(base: Profile, pr: Profile, shown: int = SHOWN) -> list[OpChange]:
    """The operators whose self time per call changed most (in either direction)."""
    b = {op.name: op.self_us for op in base.ops}
    p = {op.name: op.self_us for op in pr.ops}
    changes = [OpChange(name, b.get(name, 0.0), p.get(name, 0.0)) for name in b.keys() | p.keys()]
    changes.sort(key=lambda c: -abs(c.delta_us))
    return changes[:shown]


def grew(changes: list[OpChange], shown: int = 3) -> str:
    """The operators whose time grew most, for a one-line reason."""
    up = [c for c in changes if c.delta_us > 0][:shown]
    return "; ".join(c.describe() for c in up)
