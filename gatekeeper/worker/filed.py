"""Tensors over a file in the worker's scratch, whose pages leave the resident set once
written or read.

A large tensor the worker must keep but reads only a part at a time (the head's weights
while the base builds, the first call's outputs while the float64 reference runs, that
reference's logits) can lie in an unnamed file on the scratch's disk instead of the
heap: its pages are the page cache's, in this process's resident set only while mapped
and read, and handed back by :func:`let_go` (``madvise(MADV_DONTNEED)``: the page cache
keeps them, so they read the same again). Every mapping made here is registered while
it lives; :func:`let_go` touches no other memory (anonymous memory would read zeros
after it). Not where the scratch is memory itself (a tmpfs: a file's pages are memory
whatever maps them).
"""

from __future__ import annotations

import math
import mmap
import os
import tempfile
import weakref
from pathlib import Path

import torch

from .procmaps import release

_MEMORY_FILESYSTEMS = {"tmpfs", "ramfs"}
_live: dict[int, tuple[int, int]] = {}  # id(mapping) -> (first address, bytes)


def filesystem(folder: str) -> str:
    """The type of the filesystem ``folder`` lies on (``/proc/self/mounts``); "" unknown."""
    path, best, kind = os.path.realpath(folder), -1, ""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, kind = len(point), fields[2]
    return kind


def on_disk(folder: str) -> bool:
    """Whether a file in ``folder`` takes no memory of its own once written back."""
    return filesystem(folder) not in _MEMORY_FILESYSTEMS


def register(mapping: mmap.mmap, base: int) -> None:
    """``mapping`` (of a file, at address ``base``) is one :func:`let_go` may hand back,
    for as long as it lives."""
    key = id(mapping)
    _live[key] = (base, len(mapping))
    weakref.finalize(mapping, _live.pop, key, None)


def let_go(t: torch.Tensor, at: int, n: int) -> None:
    """The pages behind bytes ``at`` to ``at + n`` of ``t`` out of the resident set, where
    ``t`` lies in a file mapped here; nothing otherwise."""
    if t.device.type != "cpu":
        return
    ptr = t.data_ptr() + at
    for base, size in list(_live.values()):
        if base <= ptr and ptr + n <= base + size:
            release(ptr, n)
            return


def empty(
    shape: tuple[int, ...], dtype: torch.dtype, folder: str | None = None
) -> torch.Tensor | None:
    """An uninitialised CPU tensor over a new unnamed file in ``folder`` (the temporary
    folder unless given), mapped shared, its blocks reserved (a full disk fails here,
    never as a fault while it is written); None where the folder is memory or the file
    cannot be made."""
    folder = folder or tempfile.gettempdir()
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if not n or not on_disk(folder):
        return None
    try:
        with tempfile.TemporaryFile(dir=folder) as f:  # unnamed: gone with the mapping
            os.posix_fallocate(f.fileno(), 0, n)
            mapping = mmap.mmap(f.fileno(), n, flags=mmap.MAP_SHARED)
    except (OSError, ValueError):
        return None
    flat = torch.frombuffer(mapping, dtype=torch.uint8, count=n)
    register(mapping, flat.data_ptr())
    return flat.view(dtype).view(shape)


#: bytes copied into a file at a time by :func:`copy_into`
_STEP = 8 << 20


def copy(t: torch.Tensor, least: int = 1 << 20) -> torch.Tensor | None:
    """``t``'s values in a new tensor over a file (:func:`empty`), written a chunk at a
    time (:func:`copy_into`); None where ``t`` is not a contiguous CPU tensor of
    ``least`` bytes or more, or no file can be made."""
    n = t.numel() * t.element_size()
    if t.device.type != "cpu" or n < least or not t.is_contiguous():
        return None
    out = empty(tuple(t.shape), t.dtype)
    return out if out is not None and copy_into(out, t) else None


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """``src``'s bytes into ``dst`` (both contiguous, of one size; ``dst`` over a file's
    mapping) :data:`_STEP` at a time, each chunk's pages of ``dst`` handed back once
    written and of ``src``, where it lies in a file mapped here, once read. False (and
    nothing copied) for a dtype without a byte view."""
    try:
        to, frm = dst.reshape(-1).view(torch.uint8), src.reshape(-1).view(torch.uint8)
    except RuntimeError:
        return False
    n = frm.numel()
    for at in range(0, n, _STEP):
        size = min(_STEP, n - at)
        to[at : at + size].copy_(frm[at : at + size])
        release(to.data_ptr() + at, size)
        let_go(frm, at, size)
    return True
