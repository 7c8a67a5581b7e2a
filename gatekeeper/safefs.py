"""How the parent touches files a worker may have made, and writes its own: never
through a link, a FIFO or a device (docs/hardening.md, "The parent's files").

A worker's box writes only its own folders (its scratch, its cache dir); what the
parent reads out of them it opens with :func:`open_regular` (``O_NOFOLLOW``, a plain
file or a refusal, never a wait on a FIFO, its size capped), and every file the parent
writes is created new (``O_EXCL | O_NOFOLLOW``) beside its name, then renamed over it
(:func:`write_new`, :func:`copy_new`): a link, hard link or FIFO planted at the name is
replaced, never written through. Folders of a tree the parent fills (a cache dir a
worker also wrote) are walked the same way (:func:`folder_fd`). Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class NotPlain(OSError):
    """A name that is not a plain file (a link, a FIFO, a device, a folder), or one over
    its cap: refused unread."""


def open_regular(path: Path | str, cap: int | None = None, *, dir_fd: int | None = None) -> int:
    """An open descriptor of ``path`` when it is a plain file of at most ``cap`` bytes
    (never through a final symlink, never blocking on a FIFO); else :class:`NotPlain`
    or the OSError of the open."""
    try:
        fd = os.open(path, _READ, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotPlain(errno.ELOOP, "a symbolic link, refused", str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotPlain(errno.EINVAL, "not a plain file, refused", str(path))
        if cap is not None and st.st_size > cap:
            raise NotPlain(errno.EFBIG, f"{st.st_size} bytes, more than {cap}", str(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path | str, cap: int) -> bytes:
    """The bytes of a plain file of at most ``cap`` bytes (:func:`open_regular`),
    checked again while read."""
    fd = open_regular(path, cap)
    with os.fdopen(fd, "rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise NotPlain(errno.EFBIG, f"grew past {cap} bytes while read", str(path))
    return data


def read_tail(path: Path | str, size: int = 64 * 2**10) -> str:
    """The last ``size`` bytes of a log, as text ('' when it cannot be read, or is not
    a plain file: never followed, never waited on)."""
    try:
        with os.fdopen(open_regular(path), "rb") as f:
            end = f.seek(0, os.SEEK_END)
            f.seek(max(0, end - size))
            return f.read(size).decode(errors="replace")
    except OSError:
        return ""


def sha256_regular(path: Path | str) -> tuple[str, int]:
    """The sha256 and size of a plain file (:func:`open_regular`)."""
    h, size = hashlib.sha256(), 0
    with os.fdopen(open_regular(path), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def _part_name(name: str) -> str:
    return f".{name}.{secrets.token_hex(4)}.part"


@contextlib.contextmanager
def new_file(
    path: Path | str, mode: int = 0o644, *, dir_fd: int | None = None
) -> Iterator[BinaryIO]:
    """A file written under a new name beside ``path`` (``O_EXCL | O_NOFOLLOW``: never
    an existing one) and renamed over ``path`` when the block ends without error (a
    link, hard link or FIFO at ``path`` is replaced, not written through); removed if
    it fails."""
    path = Path(path)
    part, dest = _part_name(path.name), path.name
    if dir_fd is None:  # beside the path
        part, dest = str(path.with_name(part)), str(path)
    fd = os.open(part, _NEW, mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.rename(part, dest, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(part, dir_fd=dir_fd)
        raise


def write_new(path: Path | str, data: bytes | str, mode: int = 0o644) -> None:
    """``path`` holds ``data`` (:func:`new_file`)."""
    with new_file(path, mode) as f:
        f.write(data.encode() if isinstance(data, str) else data)


def copy_new(
    src: Path | str,
    dest: Path | str,
    cap: int | None = None,
    *,
    mode: int = 0o644,
    dir_fd: int | None = None,
) -> tuple[str, int]:
    """A plain file of a worker's (:func:`open_regular`, at most ``cap`` bytes) copied
    to ``dest`` (:func:`new_file`); the sha256 and size of exactly the bytes copied."""
    h, size = hashlib.sha256(), 0
    with os.fdopen(open_regular(src, cap), "rb") as f, new_file(dest, mode, dir_fd=dir_fd) as out:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            size += len(chunk)
            if cap is not None and size > cap:
                raise NotPlain(errno.EFBIG, f"grew past {cap} bytes while read", str(src))
            h.update(chunk)
            out.write(chunk)
    return h.hexdigest(), size


def folder_fd(root: Path | str, rel: Path | str) -> int:
    """An open descriptor of the folder ``root/rel``, made where missing, each part
    below ``root`` opened without following a link; a part that is not a folder (a link
    a worker planted where one should be, a file) is removed and made a folder."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in Path(rel).parts:
            if part in ("", ".", ".."):
                raise ValueError(f"{rel}: not a plain relative path")
            fd = _step(fd, part)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _step(fd: int, part: str) -> int:
    """The folder ``part`` of the open folder ``fd`` (which it closes), opened or made."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            return os.open(part, flags, dir_fd=fd)
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            os.unlink(part, dir_fd=fd)  # a link or a file where a folder should be
        with contextlib.suppress(FileExistsError):
            os.mkdir(part, 0o755, dir_fd=fd)
        return os.open(part, flags, dir_fd=fd)
    finally:
        os.close(fd)


def plain_files(root: Path) -> Iterator[tuple[str, Path]]:
    """Every plain file under ``root`` (relative POSIX path, path), in sorted order,
    never through a link (linked folders are not entered, linked files not listed)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel_dir = Path(dirpath).relative_to(root)
        for name in sorted(filenames):
            path = Path(dirpath, name)
            try:
                st = path.lstat()
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield (rel_dir / name).as_posix(), path
