"""The parent's temporary folders, known by name while they are open: a worker's box
removes them all if this process dies while the worker runs (killed, even by SIGKILL:
:mod:`gatekeeper.boundary.confine`), so no run leaves its scratch behind."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_open: list[Path] = []


@contextmanager
def scratch_dir(prefix: str) -> Iterator[str]:
    """A new temporary folder (``tempfile.TemporaryDirectory``), removed at the end, and
    by the running worker's box if this process dies first."""
    with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as tmp:
        _open.append(Path(tmp))
        try:
            yield tmp
        finally:
            _open.remove(Path(tmp))


def held() -> list[Path]:
    """The folders :func:`scratch_dir` has open now."""
    return list(_open)
