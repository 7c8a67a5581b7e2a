"""Where a paired run's two sides keep their weights.

The head and the base commit's version of a target live in one worker. Their weights
are built one after the other, so the allocator placed them differently
(:func:`same_placement` places both again, alike), and where the two hold the same
bytes, one copy serves both (:func:`share_identical`): a checkpoint both sides load,
or a large model both build from one seed.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import torch

from .fp64 import weight_bytes
from .memory import give_back, last_level_cache
from .procmaps import PAGE, PAGEMAP, file_mappings, file_page, page_entries, present, swapped

# same_placement hands freed pages back after every this many bytes copied: a 1B model's
# second placement (halfway through the timed rounds) left 0.9 GiB more resident without
_GIVE_BACK_EVERY = 256 << 20
# a CPU tensor this large is its own mapping, whatever the allocator's state: glibc
# serves every request of its mmap threshold or more by mmap, and that threshold never
# rises past 32 MiB on a 64-bit machine (DEFAULT_MMAP_THRESHOLD_MAX)
_OWN_MAPPING = 32 << 20


def outgrows_cache(model: torch.nn.Module, cache: int | None = None) -> bool:
    """Whether ``model``'s weights outgrow twice its device's last-level cache
    (``cache``: its bytes, else :func:`~gatekeeper.worker.memory.last_level_cache`).
    Within it, a paired side that reads the weights the other side (or eager) just
    read finds them in the cache: each side keeps weights of its own. Past it,
    nothing of the start of the model is left in the cache by the next call."""
    t = next(iter([*model.parameters(), *model.buffers()]), None)
    device = str(t.device) if t is not None else "cpu"
    limit = 2 * (cache if cache is not None else last_level_cache(device))
    return weight_bytes(model) > limit


class FileMaps:
    """This process's mappings of files (``/proc/self/maps``), read once: where a CPU
    tensor's bytes lie in a file mapped into memory (a safetensors checkpoint that
    ``from_pretrained`` or ``safe_open`` loaded), and whether those pages still hold the
    file's own bytes (``/proc/self/pagemap``: none copied on write)."""

    def __init__(self) -> None:
        self.maps = [m for m in file_mappings() if m.file[1] != "0"]
        self._starts = [m.lo for m in self.maps]

    def place(self, t: torch.Tensor) -> tuple[tuple[str, str], int] | None:
        """The file (device, inode) and offset in it of ``t``'s bytes, where they lie
        whole in one mapping of a file; None otherwise (a GPU tensor, the heap)."""
        if t.device.type != "cpu" or not self.maps:
            return None
        ptr, n = t.data_ptr(), t.numel() * t.element_size()
        i = bisect.bisect_right(self._starts, ptr) - 1
        if i < 0 or n == 0:
            return None
        m = self.maps[i]
        return (m.file, m.offset + ptr - m.lo) if ptr + n <= m.hi else None

    @staticmethod
    def unmodified(t: torch.Tensor) -> bool:
        """Whether every page under ``t`` that is in memory is the file's own page (none
        written, so copied on write, and none swapped out): its bytes are the file's."""
        ptr, n = t.data_ptr(), t.numel() * t.element_size()
        try:
            with open(PAGEMAP, "rb") as f:
                entries = page_entries(ptr, ptr + n, f)
        except OSError:
            return False
        pages = (ptr + n - 1) // PAGE - ptr // PAGE + 1
        bad = any(swapped(e) or (present(e) and not file_page(e)) for e in entries)
        return not bad and len(entries) == pages


def _same_file_bytes(a: torch.Tensor, b: torch.Tensor, maps: FileMaps) -> bool:
    """Both tensors are the same bytes of the same file, unwritten: equal, unread."""
    where = maps.place(a)
    return (
        where is not None and where == maps.place(b) and maps.unmodified(a) and maps.unmodified(b)
    )


def storages(m: torch.nn.Module) -> dict[int, list[torch.Tensor]]:
    """``m``'s parameters and buffers of plain torch.Tensor (a quantized weight or a
    DTensor's shard has no storage of its own here), by the address of their storage."""
    seen: dict[int, list[torch.Tensor]] = {}
    for t in [*m.parameters(), *m.buffers()]:
        if type(t.data) is torch.Tensor:
            seen.setdefault(t.untyped_storage().data_ptr(), []).append(t)
    return seen


def owns_its_storage(ts: list[torch.Tensor]) -> bool:
    """Whether one tensor alone holds a storage (:func:`storages`' list), whole: a tied
    weight is one Parameter object; a view, or a tensor another shares, is not."""
    return (
        len(ts) == 1
        and ts[0].storage_offset() == 0
        and ts[0].untyped_storage().nbytes() == ts[0].numel() * ts[0].element_size()
    )


def share_identical(
    head: object,
    base: object,
    cache: int | None = None,
    restore: Callable[[torch.Tensor], None] | None = None,
) -> int:
    """Paired, where the weights outgrow the cache (:func:`outgrows_cache`; within it
    each side keeps its own, or the side that runs second would find the weights the
    other just read in the cache): each base parameter that holds the head's bytes (the
    same name, shape, dtype and strides) becomes the head's tensor, so the two sides
    keep one copy of what they share; the bytes shared. A tensor both loaded from the
    same bytes of one checkpoint file (a safetensors file ``from_pretrained`` maps: the
    same pages of the page cache, counted twice in the resident set) is shared without
    a read of either; any other is compared (``torch.equal``). The modules' own
    Parameter objects stay (a tied weight stays tied); a tensor subclass (a quantized
    weight, a DTensor's shard) is left as it is. ``restore``: what brings a head weight
    the base's build found out of memory back into it (:class:`~gatekeeper.worker.spill.Spill`),
    called on each before it is compared."""
    if not isinstance(head, torch.nn.Module) or not isinstance(base, torch.nn.Module):
        return 0
    if not outgrows_cache(head, cache):
        return 0
    ours = dict(head.named_parameters())
    maps = FileMaps()
    shared = 0
    with torch.no_grad():
        for name, p in base.named_parameters():
            h = ours.get(name)
            if h is None or h is p or type(h.data) is not torch.Tensor:
                continue
            if type(p.data) is not torch.Tensor or h.data.data_ptr() == p.data.data_ptr():
                continue
            if (h.shape, h.dtype, h.device, h.stride()) != (p.shape, p.dtype, p.device, p.stride()):
                continue
            if restore is not None:
                restore(h)
            if _same_file_bytes(h.data, p.data, maps) or torch.equal(h.data, p.data):
                p.data = h.data
                shared += h.numel() * h.element_size()
    give_back()  # the base's own copies, now freed
    return shared


def same_placement(first: object, second: object, cache: int | None = None) -> None:
    """Paired: give the head's and the base's weights memory placed alike. Built
    one after the other, they are not: the head's tensors are allocated first, into an
    allocator that has served little yet, and the base's after the head was built,
    explained and copied, from an allocator in another state (glibc serves large
    blocks by ``mmap`` until frees raise its threshold, then from the heap). With 2
    threads an identical head read slower than its base: a median of +1.7% over 48
    unchanged pull requests, +1.0% over 45 with this (docs/statistics.md). Each side's
    parameters and buffers are copied into new memory, alternately, ``first``'s before
    ``second``'s (head, base, head, base, ... before the first compiles; base first
    again halfway through the timed rounds, so that neither side is always placed
    first), so both draw on the same allocator state. Only tensors that own their whole
    storage move (a tied weight keeps its tie; a view keeps its base); the model's own
    objects are kept. What stays:

    - a CPU tensor of :data:`_OWN_MAPPING` or more: it is a fresh mapping on either
      side, placed alike already, and its copy would add its own size to the peak (a
      152k-word vocabulary's embedding: 0.28x of a Qwen2-0.5B's weights);
    - where the weights outgrow the cache (:func:`outgrows_cache`), a tensor that lies
      in a mapped file (a checkpoint's safetensors): its pages are the page cache's, and
      its copy would add its size while the file's pages stay mapped (a Qwen2-0.5B
      loaded by ``from_pretrained``, paired: 4.05x its weights); within the cache, each
      side gets a copy of its own, as of any weight;
    - a tensor both sides hold (:func:`share_identical`): one placement serves both."""
    if not isinstance(first, torch.nn.Module) or not isinstance(second, torch.nn.Module):
        return

    ones, twos = storages(first), storages(second)
    both = ones.keys() & twos.keys()
    files = FileMaps() if outgrows_cache(first, cache) else None

    def movable(seen: dict[int, list[torch.Tensor]]) -> list[torch.Tensor]:
        return [
            ts[0]
            for ptr, ts in seen.items()
            if owns_its_storage(ts)
            and ptr not in both
            and not (
                ts[0].device.type == "cpu" and ts[0].untyped_storage().nbytes() >= _OWN_MAPPING
            )
            and (files is None or files.place(ts[0].data) is None)
        ]

    with torch.no_grad():
        firsts, seconds = movable(ones), movable(twos)
        moved = 0
        for i in range(max(len(firsts), len(seconds))):
            for ts in (firsts, seconds):
                if i < len(ts):
                    ts[i].data = ts[i].data.clone()
                    moved += ts[i].numel() * ts[i].element_size()
            if moved >= _GIVE_BACK_EVERY:  # the old copies' pages, as they are freed
                give_back()
                moved = 0
    give_back()
