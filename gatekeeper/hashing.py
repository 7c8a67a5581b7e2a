"""What code is identified by: the sha256 of bytes and of files (the one way every
module hashes content), and the file a module would be imported from, found without
importing anything (what a recorded dependency's hash is taken of: the worker records
a model's modules with it, :mod:`gatekeeper.worker.deps`, and the parent re-checks a
recorded set with it, :func:`gatekeeper.key.resolve_deps`). Standard library only."""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import sys
from pathlib import Path


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# -- where a module's source is, found without importing it -------------------------------
def search_path(base_dir: Path) -> list[str]:
    """Where the worker looks for the user's modules: the config's folder first, then
    this interpreter's path, then the current directory last."""
    cwd = os.getcwd()
    rest = [p for p in sys.path if p and p not in (str(base_dir), cwd)]
    return [str(base_dir), *rest, cwd]


def _find_spec(name: str, path: list[str] | None, search: list[str]):
    for finder in sys.meta_path:
        try:
            if finder is importlib.machinery.PathFinder:
                spec = finder.find_spec(name, path if path is not None else search)
            else:
                find = getattr(finder, "find_spec", None)
                spec = find(name, path) if find else None
        except Exception:  # a third-party finder may raise anything: not found there
            spec = None
        if spec is not None:
            return spec
    return None


def locate(name: str, search: list[str]) -> tuple[bool, str | None]:
    """(found, file) for module ``name`` as ``search`` would import it, without running
    any of it (parent packages are located, never imported; sys.modules is not read)."""
    parts = name.split(".")
    path: list[str] | None = None
    spec = None
    for i in range(len(parts)):
        spec = _find_spec(".".join(parts[: i + 1]), path, search)
        if spec is None:
            return False, None
        if i < len(parts) - 1:
            if not spec.submodule_search_locations:
                return False, None
            path = list(spec.submodule_search_locations)
    assert spec is not None
    origin = spec.origin if spec.has_location else None
    return True, origin if origin and os.path.isfile(origin) else None
