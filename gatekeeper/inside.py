"""Paths that documents name, kept inside their folder."""

from __future__ import annotations

from pathlib import Path

from .errors import GatekeeperError


def contained(folder: Path, name: str, what: str) -> Path:
    """``folder / name`` for a ``name`` that a document gives (``what`` says which
    field of which file): a relative path of plain segments that resolves, symbolic
    links followed, inside ``folder``. Anything else (absolute, ``..``, a backslash, a
    link out of the folder) is a one-line error: documents come from pull requests'
    jobs, and a path in one must never reach a file outside its folder."""
    parts = name.split("/")
    if (
        not name
        or name.startswith("/")
        or "\\" in name
        or "\0" in name
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise GatekeeperError(f"{what}: {name!r} is not a relative path inside {folder}")
    path = folder.joinpath(*parts)
    try:
        inside = path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        inside = False
    if not inside:
        raise GatekeeperError(f"{what}: {name!r} leads outside {folder}")
    return path
