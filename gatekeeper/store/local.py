"""The embedded default backend: a directory on the local disk.

Atomicity comes from the file system: every write goes to a temporary file in the same
directory and is published by ``os.link`` (create-only, fails if the name exists) or
``os.replace`` (compare-and-swap, under an exclusive ``flock`` on a lock file beside it).
ETags are the sha256 of the content, so they are stable across processes.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..hashing import sha256_bytes, sha256_file
from ..errors import PreconditionFailed, StoreError
from .base import Backend, ObjectInfo

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

    def _tmp_beside(self, path: Path) -> Path:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        except OSError as e:
            raise StoreError(f"cannot write to store {self.root}: {e.strerror or e}") from e
        os.close(fd)
        return Path(tmp)

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

    def _publish(self, tmp: Path, path: Path, key: str, if_none_match: bool,
                 if_match: str | None) -> str:
        etag = sha256_file(tmp)
        try:
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
        finally:
            tmp.unlink(missing_ok=True)
        return etag

    # -- Backend -----------------------------------------------------------------------
    def get(self, key: str) -> tuple[bytes, str] | None:
        path = self._path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StoreError(f"cannot read {path}: {e.strerror or e}") from e
        return data, sha256_bytes(data)

    def download(self, key: str, dest: Path) -> bool:
        path = self._path(key)
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        try:
            shutil.copyfile(path, tmp)
        except FileNotFoundError:
            tmp.unlink(missing_ok=True)
            return False
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise StoreError(f"cannot read {path}: {e.strerror or e}") from e
        os.replace(tmp, dest)
        return True

    def put(self, key: str, data: bytes, *, if_none_match: bool = False,
            if_match: str | None = None) -> str:
        path = self._path(key)
        tmp = self._tmp_beside(path)
        tmp.write_bytes(data)
        return self._publish(tmp, path, key, if_none_match, if_match)

    def upload(self, key: str, src: Path, *, if_none_match: bool = False) -> str:
        path = self._path(key)
        tmp = self._tmp_beside(path)
        shutil.copyfile(src, tmp)
        return self._publish(tmp, path, key, if_none_match, None)

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        return ObjectInfo(key, st.st_size, st.st_mtime, sha256_file(path))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        if not self.root.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if d != _LOCKS]
            for name in filenames:
                if name.startswith(".tmp-") or name.endswith(".part"):
                    continue
                full = Path(dirpath) / name
                key = full.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    st = full.stat()
                    yield ObjectInfo(key, st.st_size, st.st_mtime, None)

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        # tidy empty folders up to the root
        parent = path.parent
        while parent != self.root:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent
