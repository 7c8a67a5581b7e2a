"""The small interface every store backend implements.

A backend stores opaque objects under '/'-separated keys relative to its root. It knows
nothing of bundles, baselines or torch: the layout lives in :mod:`gatekeeper.store.layout`.

Conditional writes are what make publishing atomic:

* ``put(..., if_none_match=True)`` creates the object only if it does not exist yet,
  else raises :class:`~gatekeeper.errors.PreconditionFailed`.
* ``put(..., if_match=etag)`` replaces the object only if its current ETag is ``etag``
  (compare-and-swap), else raises ``PreconditionFailed``.

Backends raise :class:`~gatekeeper.errors.StoreError` (or ``StoreUnavailable``) with a
one-line message for every failure they expect; absent objects are ``None``, not errors.
So a caller can tell "the store answered: there is none" (``None``) from "the store
could not be read" (an exception), and must not turn the second into the first.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import ObjectTooLarge, StoreError


@dataclass(frozen=True)
class ObjectInfo:
    key: str  # relative to the backend's root, '/'-separated
    size: int
    modified: float  # epoch seconds
    etag: str | None = None


class Backend(abc.ABC):
    """Object storage under one root: a local directory or an S3 bucket and prefix."""

    uri: str

    @abc.abstractmethod
    def get(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str] | None:
        """The object's bytes and ETag, or None when absent. An object larger than
        ``max_bytes`` raises :class:`~gatekeeper.errors.ObjectTooLarge` before more than
        ``max_bytes`` of it are read."""

    @abc.abstractmethod
    def download(self, key: str, dest: Path, *, max_bytes: int | None = None) -> bool:
        """Write the object to ``dest`` (atomically); False when absent. Larger than
        ``max_bytes``: ``ObjectTooLarge``, and nothing is left at ``dest``."""

    @abc.abstractmethod
    def put(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        """Store ``data`` under ``key`` and return its new ETag."""

    @abc.abstractmethod
    def upload(self, key: str, src: Path, *, if_none_match: bool = False) -> str:
        """Store the file ``src`` under ``key`` (large objects) and return its ETag."""

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """Size, time and ETag of one object, or None when absent."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in no particular order."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove one object; absent is fine."""

    def temporaries(self) -> Iterator[ObjectInfo]:
        """What interrupted writes left behind: never an object, invisible to ``list``
        and ``get``; ``delete`` removes one. S3 has none (an upload is invisible until
        complete; incomplete multipart uploads are a lifecycle rule's job)."""
        return iter(())

    def close(self) -> None:  # noqa: B027 - optional: most backends hold nothing to close
        pass


def too_large(where: str, max_bytes: int, size: int | None = None) -> ObjectTooLarge:
    """The one-line refusal of an object over its size cap."""
    size_text = f"{size} bytes" if size is not None else "larger"
    return ObjectTooLarge(
        f"{where}: refused unread: {size_text}, more than the {max_bytes} bytes it may have"
    )


def store_error(uri: str, e: Exception, doing: str = "") -> StoreError:
    """``e`` as one line that names the store (unless it does already) and what failed."""
    text = str(e)
    if uri not in text:
        text = f"store {uri}: {text}"
    if doing:
        text = f"{doing}: {text}"
    cls = type(e) if isinstance(e, StoreError) else StoreError
    return cls(text)
