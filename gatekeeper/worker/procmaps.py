"""This process's memory as Linux shows it, without torch (the worker server reads it
before a fork): its mappings of files (``/proc/self/maps``) and the state of each of
their pages (``/proc/self/pagemap``: present, swapped, a file's page). Read by the
paired placement (:mod:`gatekeeper.worker.placement`: whether a weight is a file's own
bytes) and the worker server (:mod:`gatekeeper.worker.server`: the library pages a
forked child maps again)."""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

PAGE = os.sysconf("SC_PAGE_SIZE")
PAGEMAP = "/proc/self/pagemap"


@dataclass(frozen=True)
class Mapping:
    """One mapping of a file: its addresses ``[lo, hi)``, permissions, the offset in the
    file it starts at, and the file (device, inode)."""

    lo: int
    hi: int
    perms: str
    offset: int
    file: tuple[str, str]


def file_mappings() -> list[Mapping]:
    """This process's mappings of files (a path), by address; none where there is no
    ``/proc`` (not Linux)."""
    found = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 6 or not fields[5].startswith("/"):
                    continue
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                found.append(Mapping(lo, hi, fields[1], int(fields[2], 16), (fields[3], fields[4])))
    except OSError:
        return []
    return sorted(found, key=lambda m: m.lo)


def page_entries(lo: int, hi: int, pagemap: BinaryIO) -> tuple[int, ...]:
    """The pagemap entries of the pages over ``[lo, hi)`` (``pagemap``: ``PAGEMAP``
    opened in binary)."""
    first, last = lo // PAGE, (hi - 1) // PAGE
    pagemap.seek(first * 8)
    data = pagemap.read((last - first + 1) * 8)
    return struct.unpack(f"{len(data) // 8}Q", data)


def present(entry: int) -> bool:
    return bool(entry >> 63)


def swapped(entry: int) -> bool:
    return bool((entry >> 62) & 1)


def file_page(entry: int) -> bool:
    """A page of a file's own (mapped from the page cache: not copied on write)."""
    return bool((entry >> 61) & 1)


def release(ptr: int, n: int) -> None:
    """The whole pages within bytes ``ptr`` to ``ptr + n`` of a file's mapping out of
    this process's resident set (``madvise(MADV_DONTNEED)``); the page cache keeps
    them, so a shared mapping's writes stay in the file and an unwritten private
    mapping reads the file's bytes again. Only ever for a file's mapping: anonymous
    memory would read zeros after it. Nothing where the C library has no ``madvise``."""
    lo = (ptr + PAGE - 1) // PAGE * PAGE
    hi = (ptr + n) // PAGE * PAGE
    madvise = _madvise()
    if hi > lo and madvise is not None:
        madvise(lo, hi - lo, mmap.MADV_DONTNEED)


@functools.cache
def _madvise() -> Any:
    """The C library's ``madvise``, looked up once (a check calls :func:`release` for
    each chunk it compares and each block of float64 logits it writes); None without."""
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise
