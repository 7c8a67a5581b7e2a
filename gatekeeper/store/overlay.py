"""A scratch store over a read-only one: reads see both, writes go to the scratch store.

``bisect`` compiles commits the store has no bundle of, and measures each commit against
the good one many times over. It must never write the user's store (a CI job that
bisects holds read access only), yet the bundles it compiles should serve its later
measurements: the good commit's bundle warm-starts every paired measurement, and a
commit without a bundle is compiled seeded from the one compiled before it. So the
bundles go to a local directory under ``--out``, stacked over the store:

* a read (``get``, ``download``, ``head``) finds the scratch object first, else the
  store's;
* ``list`` yields the scratch objects, then the store's that the scratch store does not
  shadow;
* a write goes to the scratch store only; create-only (``if_none_match``) also fails
  where the store has the key, and compare-and-swap (``if_match``) on an object only
  the store has copies it up when the ETag is the store's (a manifest note);
* ``delete`` removes the scratch object only.

The lower store is never written, deleted from or closed here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..errors import PreconditionFailed
from .base import Backend, ObjectInfo


class OverlayBackend(Backend):
    def __init__(self, upper: Backend, lower: Backend) -> None:
        self.upper, self.lower = upper, lower
        self.uri = f"{upper.uri} over {lower.uri}"

    def get(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str] | None:
        got = self.upper.get(key, max_bytes=max_bytes)
        return got if got is not None else self.lower.get(key, max_bytes=max_bytes)

    def download(self, key: str, dest: Path, *, max_bytes: int | None = None) -> bool:
        return self.upper.download(key, dest, max_bytes=max_bytes) or self.lower.download(
            key, dest, max_bytes=max_bytes
        )

    def head(self, key: str) -> ObjectInfo | None:
        return self.upper.head(key) or self.lower.head(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        seen = set()
        for info in self.upper.list(prefix):
            seen.add(info.key)
            yield info
        for info in self.lower.list(prefix):
            if info.key not in seen:
                yield info

    def _may_write(self, key: str, if_none_match: bool, if_match: str | None) -> bool:
        """Whether a conditional write may go to the scratch store, where the key may be
        the lower store's only; True: as asked, False: create-only in the scratch store
        (a copy-up); else PreconditionFailed."""
        if self.upper.head(key) is not None:
            return True
        below = self.lower.head(key)
        if below is None:
            return True
        if if_none_match:
            raise PreconditionFailed(f"{key}: exists in {self.lower.uri}")
        if if_match is not None:
            if below.etag != if_match:
                raise PreconditionFailed(f"{key}: changed in {self.lower.uri}")
            return False
        return True

    def put(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        if self._may_write(key, if_none_match, if_match):
            return self.upper.put(key, data, if_none_match=if_none_match, if_match=if_match)
        return self.upper.put(key, data, if_none_match=True)

    def upload(self, key: str, src: Path, *, if_none_match: bool = False) -> str:
        self._may_write(key, if_none_match, None)
        return self.upper.upload(key, src, if_none_match=if_none_match)

    def delete(self, key: str) -> None:
        self.upper.delete(key)

    def temporaries(self) -> Iterator[ObjectInfo]:
        return self.upper.temporaries()

    def close(self) -> None:
        self.upper.close()
