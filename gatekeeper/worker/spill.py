"""A paired run's head weights out of memory while the base commit's factory builds.

The head and the base live in one worker, built one after the other, so the second
build's own peak stands on the first model's weights: a Qwen2-0.5B built from its config
peaks 0.54 GB above what it keeps (its LM head's weight allocated before it is tied), and
paired it peaked at 2.51x its weights, one model plus the other's build (docs/scale.md).
Where the weights outgrow the cache (:func:`~gatekeeper.worker.placement.outgrows_cache`),
:func:`spilled` writes the head's weights to a file in the worker's scratch, and each
weight reads that file's pages (a private mapping: the page cache's pages, in the
resident set only once read) while the base builds. :func:`share_identical` brings a
weight back before it compares it, and the rest come back at the end, a chunk at a time,
each chunk's file pages let go once copied: at no point are both whole models and a
build resident. Not where the scratch is memory itself (a tmpfs: its file's pages are
memory whatever maps them), nor on a GPU, nor for a weight that lies in a mapped file
already (a loaded checkpoint's: spilled, it came back as a copy out of the checkpoint, and
the base's load of the same file could not share it unread: 3.21x a loaded Qwen2-0.5B's
weights paired, against 1.59x).
"""

from __future__ import annotations

import mmap
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from . import filed
from .memory import give_back
from .placement import FileMaps, outgrows_cache, owns_its_storage, storages
from .procmaps import PAGE

# a weight is copied back this many bytes at a time, each chunk's file pages let go after
_CHUNK = 16 << 20
# below this, the weights stay: the write and the read back would cost more than they free
SPILL_FROM = 256 << 20


class Spill:
    """The head's weights in a file while the base builds: each weight's ``.data`` a view
    of a private mapping of it, until :meth:`restore` copies it back into memory."""

    def __init__(self, spilled: dict[int, tuple[torch.Tensor, int]], mapping: mmap.mmap):
        self._spilled, self._mapping = spilled, mapping

    def restore(self, t: torch.Tensor) -> None:
        """``t``'s bytes back in memory of its own, a chunk at a time, each chunk's pages
        of the file let go once copied; nothing where ``t`` is not in the file."""
        got = self._spilled.pop(id(t), None)
        if got is None:
            return
        _, offset = got
        view = t.data
        own = torch.empty_like(view, memory_format=torch.contiguous_format)
        src, dst = view.reshape(-1).view(torch.uint8), own.reshape(-1).view(torch.uint8)
        for at in range(0, src.numel(), _CHUNK):
            dst[at : at + _CHUNK].copy_(src[at : at + _CHUNK])
            self._mapping.madvise(mmap.MADV_DONTNEED, offset + at, min(_CHUNK, src.numel() - at))
        with torch.no_grad():
            t.data = own

    def close(self) -> None:
        """Every weight back in memory, and the mapping gone."""
        for t, _ in list(self._spilled.values()):
            self.restore(t)
        try:
            self._mapping.close()
        except BufferError:  # a view of it is still held somewhere: unmapped when freed
            pass


def _spillable(model: torch.nn.Module) -> list[torch.Tensor]:
    """The CPU tensors that own their whole storage (:func:`owns_its_storage`; a
    quantized weight or a DTensor's shard stays), contiguous, of 1 MiB or more, in
    memory of their own: a tensor that lies in a mapped file (a checkpoint's
    safetensors) is the page cache's already, and the base's load of the same file
    shares it unread (:func:`share_identical`) only while it stays there."""
    files = FileMaps()
    return [
        ts[0]
        for ts in storages(model).values()
        if owns_its_storage(ts)
        and ts[0].device.type == "cpu"
        and ts[0].is_contiguous()
        and ts[0].numel() * ts[0].element_size() >= 1 << 20
        and files.place(ts[0].data) is None
    ]


def _spill(tensors: list[torch.Tensor], folder: str | None) -> Spill:
    """Write ``tensors`` to an unnamed file in ``folder`` (the worker's ``TMPDIR``), map
    it privately and make each tensor's ``.data`` its view of the mapping."""
    offsets, size = [], 0
    for t in tensors:
        offsets.append(size)
        n = t.numel() * t.element_size()
        size += (n + PAGE - 1) // PAGE * PAGE
    with tempfile.TemporaryFile(dir=folder) as f:  # unnamed: gone with the mapping
        for t, at in zip(tensors, offsets, strict=True):
            f.seek(at)
            f.write(t.detach().reshape(-1).view(torch.uint8).numpy().data)
        f.truncate(size)
        f.flush()
        mapping = mmap.mmap(
            f.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
        )
    spilled: dict[int, tuple[torch.Tensor, int]] = {}
    with torch.no_grad():
        for t, at in zip(tensors, offsets, strict=True):
            n = t.numel() * t.element_size()
            flat = torch.frombuffer(mapping, dtype=torch.uint8, count=n, offset=at)
            if not spilled:
                filed.register(mapping, flat.data_ptr() - at)  # never written through
            t.data = flat.view(t.dtype).view(t.shape)
            spilled[id(t)] = (t, at)
    return Spill(spilled, mapping)


@contextmanager
def spilled(
    model: object, cache: int | None = None, least: int = SPILL_FROM, folder: str | None = None
) -> Iterator[Spill | None]:
    """While the block runs (the base's build), ``model``'s weights lie in a file
    (:class:`Spill`), where they outgrow the cache and come to ``least`` bytes or more on
    the CPU, and the scratch ``folder`` (default: the temporary folder) is on a disk;
    every weight is back in memory when it ends. Yields None where nothing moved: a
    file that could not be written (a full disk) leaves the weights as they were."""
    folder = folder or tempfile.gettempdir()
    tensors = _spillable(model) if isinstance(model, torch.nn.Module) else []
    if (
        not tensors
        or sum(t.numel() * t.element_size() for t in tensors) < least
        or not outgrows_cache(model, cache)  # type: ignore[arg-type]
        or not filed.on_disk(folder)
    ):
        yield None
        return
    try:
        spill = _spill(tensors, folder)
    except OSError:  # no room for it: the weights stay where they are
        yield None
        return
    give_back()  # the weights' own memory, now freed
    try:
        yield spill
    finally:
        spill.close()
