"""Compiled projects one pytest run leaves for the next of the same code: the serial phase
of ``.ci/run`` (a pytest run of its own, after the parallel phases) reuses what the
end-to-end phase compiled instead of compiling it again (issue 52).

:func:`reused` builds a project into ``dest`` once and keeps a copy in pytest's cache
folder (``.pytest_cache``), under a key of everything the build could depend on: the
source of gatekeeper and of the tests (``tests/``), the Python and torch versions, and
the build's name. A later run whose key is the same copies it instead of building it;
any change to that code is a new key, so nothing stale is ever reused. One build per key
at a time (a file lock: pytest-xdist's workers share the folder), and a copy is kept only
once the build returned, so an interrupted build leaves nothing behind to reuse. Each
caller gets its own copy: what a test then writes, no other run sees.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_CODE = ("gatekeeper", "tests")


@functools.cache
def code_key() -> str:
    """A digest of the interpreter, torch and every source file of gatekeeper and its
    tests (their paths and bytes)."""
    h = hashlib.sha256(f"{sys.version}\0{_torch()}\0".encode())
    for top in _CODE:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in (".py", ".toml") and "__pycache__" not in path.parts:
                h.update(path.relative_to(ROOT).as_posix().encode() + b"\0")
                h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:20]


def _torch() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "none"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def reused(config: pytest.Config, name: str, build: Callable[[Path], None], dest: Path) -> Path:
    """``dest`` holding what ``build(dest)`` makes: copied from an earlier build of the
    same code (this run's or an earlier run's), else built here and a copy kept."""
    cache = getattr(config, "cache", None)  # none under -p no:cacheprovider
    if cache is None:  # nowhere to keep it
        build(dest)
        return dest
    folder = cache.mkdir("gatekeeper-builds")
    key = f"{name}@{code_key()}"
    kept = folder / key
    with _locked(folder / f"{name}.lock"):
        if kept.is_dir():
            shutil.copytree(kept, dest, symlinks=True)
            return dest
        build(dest)
        part = folder / f".{key}.{os.getpid()}"
        shutil.copytree(dest, part, symlinks=True)
        for old in folder.glob(f"{name}@*"):  # the same build of other code: never reused
            shutil.rmtree(old, ignore_errors=True)
        os.rename(part, kept)
    return dest
