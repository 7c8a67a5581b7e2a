"""The store: where bundles and baselines live (a local directory or S3). It knows
nothing of torch, and it does not trust what it reads (verification is bundle.py's).

* ``base``         the small interface every backend implements (objects under keys)
* ``local``, ``s3``  the two backends
* ``layout``       :class:`Store`: the bundle key scheme and its atomic publish / find
* ``baselines``    the baseline key scheme: publish (compare-and-swap), fetch, list
* ``maintenance``  ``store verify`` and ``store prune``

``open_store`` picks the backend by URI.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import StoreError
from .base import Backend, ObjectInfo
from .layout import BundleLocation, Store, StoredBundle

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")

__all__ = [
    "Backend",
    "BundleLocation",
    "ObjectInfo",
    "Store",
    "StoredBundle",
    "open_store",
]


def open_store(
    uri: str,
    *,
    read_only: bool = False,
    endpoint_url: str | None = None,
    base_dir: Path | None = None,
) -> Store:
    """``s3://bucket/prefix`` opens S3; anything else is a local directory.

    A relative local path is taken relative to ``base_dir`` (the config file's folder).
    Any other ``scheme:`` (``s3:/b``, ``S3://b``, ``gs://b``) is an error, not a folder
    of that name: a typo must not read as an empty store.
    """
    if _SCHEME.match(uri) and not uri.startswith("s3://"):
        raise StoreError(
            f"store URI {uri!r} is neither s3://bucket/prefix nor a directory "
            "(write ./" + uri + " for a directory of that name)"
        )
    if uri.startswith("s3://"):
        from .s3 import S3Backend  # boto3 is imported only when S3 is used

        backend: Backend = S3Backend(uri, endpoint_url=endpoint_url)
    else:
        from .local import LocalBackend

        path = Path(uri).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        backend = LocalBackend(path)
    return Store(backend, read_only=read_only)
