"""The embedded default backend: a directory on the local disk.

Atomicity comes from the file system: every write goes to a temporary file (``.tmp-*``)
in the same directory and is published by ``os.link`` (create-only, fails if the name
exists) or ``os.replace`` (compare-and-swap, under an exclusive ``flock`` on a lock file
beside it). ETags are the sha256 of the content, so they are stable across processes.
Objects get the mode any new file of this process gets (0666 less the umask), so a
store shared by a CI user and a service's group is readable by both when the umask
allows it.

A write that fails (a full disk, a file too large, an interrupt) removes its temporary
file and raises a one-line :class:`~gatekeeper.errors.StoreError` naming the object's
path; only a killed process leaves one behind, which readers never see and
``store prune`` removes (:meth:`LocalBackend.temporaries`). Listing tolerates files
deleted while it runs (a concurrent ``store prune``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import PreconditionFailed, StoreError
from ..hashing import sha256_bytes, sha256_file
from .base import Backend, ObjectInfo, too_large

_LOCKS = ".locks"


class LocalBackend(Backend):
    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).expanduser().absolute()
        self.uri = str(self.root)
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"store {self.root} is not a directory")

    # -- paths -------------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") for p in parts) or key.startswith(_LOCKS):
            raise StoreError(f"invalid store key {key!r}")
        return self.root.joinpath(*parts)

    @contextmanager
    def _writing(self, path: Path) -> Iterator[Path]:
        """A temporary file beside ``path`` for the body of a write: removed whatever
        happens, and any OS error (ENOSPC, EFBIG, EACCES...) becomes one line naming
        ``path``."""
        tmp: Path | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
            tmp = Path(name)
            try:
                # mkstemp makes it 0600; an object is as readable as any file this
                # process creates (a store shared by a CI user and a service's group)
                os.fchmod(fd, _file_mode())
            finally:
                os.close(fd)
            yield tmp
        except OSError as e:
            raise StoreError(f"cannot write {path}: {e.strerror or e}") from e
        finally:
            if tmp is not None:
                tmp.unlink(missing_ok=True)

    @contextmanager
    def _locked(self, key: str):
        lock = self.root / _LOCKS / (sha256_bytes(key.encode()) + ".lock")
        lock.parent.mkdir(parents=True, exist_ok=True)
        with open(lock, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _publish(
        self, tmp: Path, path: Path, key: str, if_none_match: bool, if_match: str | None
    ) -> str:
        etag = sha256_file(tmp)
        if if_none_match:
            try:
                os.link(tmp, path)  # atomic create-only
            except FileExistsError:
                raise PreconditionFailed(f"{key} exists") from None
        elif if_match is not None:
            with self._locked(key):
                current = sha256_file(path) if path.exists() else None
                if current != if_match:
                    raise PreconditionFailed(f"{key} changed (ETag {current} != {if_match})")
                os.replace(tmp, path)
        else:
            os.replace(tmp, path)
        return etag

    # -- Backend -----------------------------------------------------------------------
    def get(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str] | None:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if max_bytes is not None and size > max_bytes:
                    raise too_large(str(path), max_bytes, size)
                # a file that grows while it is read is still cut at the cap
                data = f.read() if max_bytes is None else f.read(max_bytes + 1)
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            raise StoreError(f"cannot read {path}: it is a directory") from None
        except OSError as e:
            raise StoreError(f"cannot read {path}: {e.strerror or e}") from e
        if max_bytes is not None and len(data) > max_bytes:
            raise too_large(str(path), max_bytes)
        return data, sha256_bytes(data)

    def download(self, key: str, dest: Path, *, max_bytes: int | None = None) -> bool:
        path = self._path(key)
        dest = Path(dest)
        tmp = dest.with_name(dest.name + ".part")
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "rb") as src:
                size = os.fstat(src.fileno()).st_size
                if max_bytes is not None and size > max_bytes:
                    raise too_large(str(path), max_bytes, size)
                tmp.unlink(missing_ok=True)  # a new file: never through what is at its name
                with open(tmp, "xb") as out:
                    copied = 0
                    while chunk := src.read(1 << 20):
                        copied += len(chunk)
                        if max_bytes is not None and copied > max_bytes:
                            raise too_large(str(path), max_bytes)
                        out.write(chunk)
            os.replace(tmp, dest)
        except FileNotFoundError as e:
            if str(e.filename) != str(path):  # the destination's folder went away
                raise StoreError(f"cannot copy {path} to {dest}: {e.strerror}") from e
            return False
        except OSError as e:
            raise StoreError(f"cannot copy {path} to {dest}: {e.strerror or e}") from e
        finally:
            tmp.unlink(missing_ok=True)
        return True

    def put(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        path = self._path(key)
        with self._writing(path) as tmp:
            tmp.write_bytes(data)
            return self._publish(tmp, path, key, if_none_match, if_match)

    def upload(self, key: str, src: Path, *, if_none_match: bool = False) -> str:
        path = self._path(key)
        try:
            src_file = open(src, "rb")
        except OSError as e:
            raise StoreError(f"cannot read {src}: {e.strerror or e}") from e
        with src_file, self._writing(path) as tmp:
            with open(tmp, "wb") as out:
                shutil.copyfileobj(src_file, out, 1 << 20)
            return self._publish(tmp, path, key, if_none_match, None)

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            st = path.stat()
            etag = sha256_file(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StoreError(f"cannot read {path}: {e.strerror or e}") from e
        return ObjectInfo(key, st.st_size, st.st_mtime, etag)

    def _walk(self, temporary: bool) -> Iterator[ObjectInfo]:
        """Every object (or, with ``temporary``, every leftover temporary file) with its
        size and time; a file or folder deleted meanwhile is skipped, not an error."""

        def failed(e: OSError) -> None:
            if e.errno not in (errno.ENOENT, errno.ENOTDIR):  # gone meanwhile: fine
                raise StoreError(f"cannot list {e.filename}: {e.strerror or e}") from e

        if not self.root.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(self.root, onerror=failed):
            dirnames[:] = [d for d in dirnames if d != _LOCKS]
            for name in filenames:
                if _is_temporary(name) != temporary:
                    continue
                full = Path(dirpath) / name
                try:
                    st = full.stat()
                except FileNotFoundError:
                    continue  # deleted since the folder was read
                except OSError as e:
                    raise StoreError(f"cannot list {full}: {e.strerror or e}") from e
                yield ObjectInfo(
                    full.relative_to(self.root).as_posix(), st.st_size, st.st_mtime, None
                )

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return (info for info in self._walk(False) if info.key.startswith(prefix))

    def temporaries(self) -> Iterator[ObjectInfo]:
        return self._walk(True)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink(missing_ok=True)
        except OSError as e:
            raise StoreError(f"cannot delete {path}: {e.strerror or e}") from e
        # tidy empty folders up to the root
        parent = path.parent
        while parent != self.root:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent


def _umask() -> int:
    """This process's umask, read without changing it where Linux says it
    (``/proc/self/status``); elsewhere set and restored at once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _file_mode() -> int:
    """The mode ``open()`` gives a new file here: 0666 less the umask."""
    return 0o666 & ~_umask()


def _is_temporary(name: str) -> bool:
    """A write in progress, or one a killed process left: never an object."""
    return name.startswith(".tmp-") or name.endswith(".part")
