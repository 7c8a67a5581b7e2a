"""``torch.save`` of a document whose large tensors need not all be resident at once.

``torch.save`` reads every storage whole, and a tensor over a file's mapping (a call's
outputs kept in the worker's scratch, :meth:`gatekeeper.worker.outputs.Outputs.kept`)
then has all its pages in the resident set at once: the reference file of a Qwen2-0.5B check
(its logits and their float64 twin, 0.22 GiB) stood on top of the weights while it was
written. :func:`save` writes the document without its storages' bytes
(``torch.serialization.skip_data``), maps the file shared, and copies each tensor into
its place a chunk at a time, each chunk's pages of the file let go once written, and
of the source, where it lies in a file of the scratch, once read
(:func:`gatekeeper.worker.filed.copy_into`). Then each
data record's CRC-32, which ``skip_data`` leaves unset, is computed from the file as
read a chunk at a time and written into its headers (:func:`_fill_crcs`): the file is
``torch.save``'s, record for record, a zip that ``unzip -t`` passes. Where torch has no
``skip_data`` (before 2.6), or nothing is large, it is ``torch.save``.
"""

from __future__ import annotations

import mmap
import os
import struct
import zipfile
import zlib
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from .filed import copy_into

#: bytes read at a time to compute a record's CRC-32
CHUNK = 8 << 20
#: a document with no tensor this large is written by ``torch.save`` as it is
LARGE = 1 << 20


def save(path: str, doc: Any) -> None:
    """``torch.save(doc, path)``, a large tensor's bytes copied a chunk at a time (see
    the module docstring)."""
    skip = getattr(torch.serialization, "skip_data", None)
    leaves = tree_leaves(doc)
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    if skip is None or not any(t.numel() * t.element_size() >= LARGE for t in tensors):
        torch.save(doc, path)
        return
    with skip():
        torch.save(doc, path)
    with open(path, "r+b") as f:  # its blocks reserved: a full disk fails here, not as
        os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)  # a fault in a write
    shared = tree_leaves(_mapped_shared(path))
    try:
        for src, dst in zip(leaves, shared, strict=True):
            if isinstance(src, torch.Tensor):
                _fill(dst, src)
    finally:
        del shared  # unmapped: what was written stays in the file
    _fill_crcs(path)


def _fill_crcs(path: str) -> None:
    """Each record's CRC-32, from its bytes in the file (read a chunk at a time, not
    mapped), written into its local header and its central directory entry where it
    differs."""
    with zipfile.ZipFile(path) as z:
        infos, central = z.infolist(), z.start_dir
    with open(path, "r+b") as f:
        for info in infos:
            f.seek(info.header_offset)
            head = f.read(30)
            name, extra = struct.unpack("<HH", head[26:30])
            f.seek(info.header_offset + 30 + name + extra)
            crc, left = 0, info.compress_size
            while left:
                block = f.read(min(CHUNK, left))
                if not block:
                    break
                crc, left = zlib.crc32(block, crc), left - len(block)
            entry = central
            f.seek(entry)
            fixed = struct.unpack("<HHH", f.read(46)[28:34])
            central += 46 + sum(fixed)
            if crc != info.CRC:
                for at in (info.header_offset + 14, entry + 16):
                    f.seek(at)
                    f.write(struct.pack("<I", crc))


def _mapped_shared(path: str) -> Any:
    """The document as saved, each tensor a view of a shared mapping of the file."""
    serialization: Any = torch.serialization
    old = serialization.get_default_mmap_options()
    serialization.set_default_mmap_options(mmap.MAP_SHARED)
    try:
        return torch.load(path, mmap=True, weights_only=True)
    finally:
        serialization.set_default_mmap_options(old)


def _fill(dst: torch.Tensor, src: torch.Tensor) -> None:
    src = src.detach()
    large = src.numel() * src.element_size() >= LARGE
    if not (large and src.is_contiguous() and dst.is_contiguous() and copy_into(dst, src)):
        dst.copy_(src)
