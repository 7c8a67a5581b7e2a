"""gatekeeper.units: the one formatting of durations, sizes, counts and ratios that the
report, the dashboard and the CLI share."""

from __future__ import annotations

import math

import pytest

from gatekeeper import units
from gatekeeper.units import DASH


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (1024**2 - 1, "1.0 MiB"),  # 1023.999 KiB rounds up to the next unit, not "1024.0 KiB"
        (5 * 1024**2, "5.0 MiB"),
        (3 * 1024**3 + 1024**3 // 10, "3.1 GiB"),
        (2048 * 1024**3, "2048.0 GiB"),  # GiB is the largest unit
        (-512, "-512 B"),
        (-2048, "-2.0 KiB"),  # a shrinking bundle
    ],
)
def test_size_is_binary(n, text):
    assert units.size(n) == text


def test_size_never_says_kb_or_mb():
    for n in (10**3, 10**6, 10**9):
        assert units.size(n).split()[-1] in ("B", "KiB", "MiB", "GiB")


def test_mib_is_a_number_for_a_mib_column():
    assert units.mib(0) == "0.0"
    assert units.mib(3 * 2**20 // 2) == "1.5"
    assert units.mib(None) == DASH


@pytest.mark.parametrize(
    ("s", "text"),
    [
        (0, "0.00 µs"),
        (812e-6, "812 µs"),
        (999.4e-6, "999 µs"),
        (999.6e-6, "1.00 ms"),  # rounds into the next unit, never "1000 µs"
        (1.234e-3, "1.23 ms"),
        (0.0125, "12.5 ms"),
        (0.9996, "1.00 s"),
        (12.5, "12.5 s"),
        (99.96, "100 s"),  # never "100.0 s"
        (1234.0, "1234 s"),
        (-2.5e-3, "-2.50 ms"),  # a negative delta keeps its sign and its unit
        (-812e-6, "-812 µs"),
    ],
)
def test_seconds(s, text):
    assert units.seconds(s) == text


def test_seconds_of_nothing_and_of_non_finite():
    assert units.seconds(None) == DASH
    assert units.seconds(math.inf) == "inf"
    assert units.seconds(math.nan) == "nan"


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0"),
        (999, "999"),
        (1000, "1 k"),
        (1234, "1.23 k"),
        (999_999, "1 M"),  # never "1e+03 k"
        (45_600_000, "45.6 M"),
        (7.8e9, "7.8 G"),
        (3.2e12, "3.2e+03 G"),
        (-1234, "-1.23 k"),
        ("unavailable", "unavailable"),
        (None, DASH),
    ],
)
def test_count(n, text):
    assert units.count(n) == text


def test_change_speedup_and_the_rest():
    assert units.change(0.081) == "+8.1%"
    assert units.change(-0.005) == "-0.5%"
    assert units.change(0.0) == "+0.0%"
    assert units.change(None) == DASH
    assert units.speedup(1.234) == "1.23x"
    assert units.speedup(0.5) == "0.50x"
    assert units.speedup(None) == DASH
    assert units.number(0.812345) == "0.8123"
    assert units.number(None) == DASH
    assert units.sci(0) == "0" and units.sci(1.2e-6) == "1.2e-06" and units.sci(None) == DASH
    assert units.p_value(0.0001) == "p<0.001" and units.p_value(0.032) == "p=0.032"
    assert units.p_value(None) == DASH


def test_chart_units_follow_the_largest_value():
    assert units.time_unit([2e-3, 0.5e-3]) == ("ms", 1e-3)
    assert units.time_unit([3.0]) == ("s", 1.0)
    assert units.time_unit([5e-9]) == ("ns", 1e-9)
    assert units.time_unit([]) == ("s", 1.0)
    assert units.bytes_unit([1023]) == ("B", 1.0)
    assert units.bytes_unit([1024]) == ("KiB", 1024.0)
    assert units.bytes_unit([5 * 2**20, 10]) == ("MiB", 2.0**20)
    assert units.bytes_unit([]) == ("B", 1.0)


def test_parse_size_reads_sizes_as_people_write_them():
    assert units.parse_size("123456") == 123456
    assert units.parse_size("512KiB") == 512 << 10
    assert units.parse_size("1.5 GiB") == 3 << 29
    assert units.parse_size("12G") == units.parse_size("12GB") == 12 << 30
    for bad in ("lots", "", "-1GiB", "0", "nan"):
        with pytest.raises(ValueError):
            units.parse_size(bad)
