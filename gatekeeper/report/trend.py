"""A trend in one table cell: a unicode sparkline of the base branch's recent baselines,
with this pull request's point marked. Pure: no I/O, no torch.

>>> sparkline([1.0, 1.1, 1.0, 1.2], 1.5)
'▁▂▁▄→█'
>>> sparkline([2.0, 2.0, 2.0], None)
'▄▄▄'
>>> sparkline([], 1.0)
''
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeGuard

BARS = "▁▂▃▄▅▆▇█"
MARK = "→"  # separates the base branch's history from this PR's point
GAP = " "  # a run without a finite value


def sparkline(values: Sequence[float | None], current: float | None) -> str:
    """The base branch's last baselines (``values``, oldest first) as one bar each,
    then ``→`` and this PR's value (``current``) as a final bar on the same scale.

    The scale spans the lowest to the highest finite value of both, so a PR beyond the
    whole history reads as ``▁`` or ``█``; when they are all equal every bar is ``▄``.
    Non-finite values (and None) leave a gap. Without a history there is no trend to
    show, so the result is empty; ``current=None`` gives the history alone.

    >>> sparkline([3.0, 1.0, 2.0], 2.0)
    '█▁▅→▅'
    >>> sparkline([1.0, float("nan"), 2.0], None)
    '▁ █'
    """
    if not values:
        return ""
    finite = [v for v in [*values, current] if _finite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)

    def bar(v: float | None) -> str:
        if not _finite(v):
            return GAP
        if hi == lo:
            return BARS[3]
        return BARS[round((v - lo) / (hi - lo) * (len(BARS) - 1))]

    line = "".join(bar(v) for v in values)
    return line if current is None else f"{line}{MARK}{bar(current)}"


def _finite(v: float | None) -> TypeGuard[float]:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)
