"""Numbers and units as people read them: the one place the report, the dashboard and the
CLI format durations, sizes, counts, percentages and ratios.

Conventions:

* durations: three significant figures in the largest unit that keeps the number under
  1000 (``812 µs``, ``1.23 ms``, ``12.5 s``);
* sizes: binary units, since they divide by 1024 (``512 B``, ``1.5 KiB``, ``2.0 MiB``,
  ``3.1 GiB``); :func:`mib` for a column whose header carries the unit;
* counts (FLOPs, bytes accessed, kernels): SI prefixes, three significant figures
  (``1.23 M``);
* a relative change: signed, one decimal (``+8.1%``); a speedup: ``1.23x``.

Unknown values (None) are :data:`DASH`. No I/O, no dependencies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

DASH = "–"

# (unit, seconds), largest first
TIME_UNITS: tuple[tuple[str, float], ...] = (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6))
# (unit, bytes), largest first
BYTE_UNITS: tuple[tuple[str, int], ...] = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
# (prefix, scale), largest first
SI_PREFIXES: tuple[tuple[str, float], ...] = (("G", 1e9), ("M", 1e6), ("k", 1e3))


def _sig3(v: float) -> str:
    """Three significant figures for ``|v|`` < 1000 (``812``, ``12.5``, ``1.23``)."""
    a = abs(v)
    if a >= 99.95:
        return f"{v:.0f}"
    if a >= 9.995:
        return f"{v:.1f}"
    return f"{v:.2f}"


def seconds(x: float | None) -> str:
    """Seconds in human units: ``812 µs``, ``1.23 ms``, ``2.05 s``, signed when negative."""
    if x is None:
        return DASH
    if not math.isfinite(x):
        return str(x)
    for unit, scale in reversed(TIME_UNITS[1:]):
        if abs(x) / scale < 999.5:
            return f"{_sig3(x / scale)} {unit}"
    return f"{_sig3(x)} s"


def per_token(x: float | None) -> str:
    """Seconds per generated token: ``12.3 ms/token``."""
    return DASH if x is None else f"{seconds(x)}/token"


def rate(x: float | None) -> str:
    """Tokens per second: ``81.3 tokens/s``."""
    return DASH if x is None else f"{_sig3(x) if abs(x) < 999.5 else count(x)} tokens/s"


def span(fmt: Callable[[float | None], str], a: float, b: float) -> str:
    """Two figures of one format, the unit said once when they share it: ``12.3 ->
    13.9 ms/token``."""
    left, right = fmt(a), fmt(b)
    unit = right.split(" ", 1)[1] if " " in right else ""
    if unit and left.endswith(" " + unit):
        return f"{left.removesuffix(' ' + unit)} -> {right}"
    return f"{left} -> {right}"


def size(n: float | None) -> str:
    """Bytes in binary units: ``0 B``, ``1023 B``, ``1.0 KiB``, ``1.5 MiB``, ``2.0 GiB``."""
    if n is None:
        return DASH
    if abs(n) < 1024:
        return f"{n:.0f} B"
    for unit, scale in reversed(BYTE_UNITS):
        v = n / scale
        if round(abs(v), 1) < 1024 or unit == BYTE_UNITS[0][0]:
            return f"{v:.1f} {unit}"
    raise AssertionError("unreachable")


_SCALE = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """A size as people write it, in bytes: ``123456``, ``512KiB``, ``1.5 GiB``,
    ``12G`` (binary units; ``GB`` is read as ``GiB``); ValueError for anything else."""
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    unit = t[-1:] if t[-1:] in _SCALE else ""
    number = t[: len(t) - len(unit)].strip()
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"expected a size such as 12GiB or 500MiB, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"expected a positive size such as 12GiB, got {text!r}")
    return int(value * _SCALE[unit])


def mib(n: float | None) -> str:
    """Bytes as MiB, one decimal, no unit (for a column whose header says MiB)."""
    return DASH if n is None else f"{n / 2**20:.1f}"


def count(n: float | str | None) -> str:
    """A count with an SI prefix: ``950``, ``1.23 k``, ``45.6 M``, ``7.8 G``. A string
    (a counter's ``"unavailable"``) is shown as it is."""
    if n is None:
        return DASH
    if isinstance(n, str):
        return n
    if abs(n) < 999.5:
        return f"{n:.0f}"
    for prefix, scale in reversed(SI_PREFIXES):
        text = f"{n / scale:.3g}"
        if abs(float(text)) < 1000 or prefix == SI_PREFIXES[0][0]:
            return f"{text} {prefix}"
    raise AssertionError("unreachable")


def change(x: float | None) -> str:
    """A relative change, signed: ``+8.1%``, ``-0.5%``, ``+0.0%``."""
    return DASH if x is None else f"{x:+.1%}"


def speedup(x: float | None) -> str:
    """A ratio of times, such as eager ÷ compiled: ``1.23x``."""
    return DASH if x is None else f"{x:.2f}x"


def db(x: float | None) -> str:
    """A signal-to-noise ratio in decibels: ``41.3 dB`` (``inf dB``: identical)."""
    return DASH if x is None else f"{x:.1f} dB"


def number(x: float | None) -> str:
    """A plain number to four significant figures: ``0.8123``, ``1.235e+05``."""
    return DASH if x is None else f"{x:.4g}"


def sci(x: float | None) -> str:
    """An error size in scientific notation: ``0``, ``1.2e-06``."""
    if x is None:
        return DASH
    if not math.isfinite(x):
        return str(x)
    return "0" if x == 0 else f"{x:.1e}"


def p_value(p: float | None) -> str:
    """``p=0.032``, ``p<0.001``."""
    if p is None:
        return DASH
    return "p<0.001" if p < 0.001 else f"p={p:.2g}"


def time_unit(values: Iterable[float]) -> tuple[str, float]:
    """The unit a chart of durations reads best in (the largest its top value reaches)
    and its size in seconds: ``("ms", 1e-3)``; ``ns`` below a microsecond."""
    top = max(values, default=1.0)
    for unit, scale in TIME_UNITS:
        if top >= scale:
            return unit, scale
    return "ns", 1e-9


def bytes_unit(values: Iterable[float]) -> tuple[str, float]:
    """The binary unit a chart of sizes reads best in, and its size in bytes."""
    top = max(values, default=1.0)
    for unit, scale in BYTE_UNITS:
        if top >= scale:
            return unit, float(scale)
    return "B", 1.0
