"""Inductor's precompiled C++ headers, built once per machine, torch and compiler by a
worker that runs no model code, and lent read-only to every other worker (and to a
warmed service). No torch here.

On a CPU, inductor builds a precompiled header (about 10 CPU-seconds) in every process
that compiles or loads a C++ kernel, the cached ones included, unless the temp dir
already holds it. Each worker's temp dir is its own, so without this every worker, and
every warm start's first call, built it again. A header is C++ that later compiles
include, so the folder is written only by :mod:`gatekeeper.worker.headers` and is
read-only inside every model's box. docs/configuration.md, "Shared precompiled headers".
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from .. import facts_cache
from ..scratch import scratch_dir
from . import box

log = logging.getLogger("gatekeeper.headers")
_TIMEOUT = 900.0
# the header worker's command line and environment, given its folder and scratch
Boxed = Callable[[Path, Path], tuple[list[str], dict[str, str]]]
_USER_VARS = ("LOGNAME", "USER", "LNAME", "USERNAME")  # what getpass.getuser() reads
_tried: dict[str, Path | None] = {}  # key -> the folder, or None: its build failed
_isa: dict[Path, Path] = {}  # the folder -> its ISA check for this process's key
_ISA_PART = "isa.part"  # where the header worker leaves it (worker.headers.ISA_PART)


def folder() -> Path | None:
    """The shared folder: ``GATEKEEPER_PCH_DIR`` (``off``: none), else the user's cache
    dir's ``gatekeeper/headers``, which is none when it lies where a worker's box may
    write (the temp dir, ``/dev/shm``: model code could have made it first)."""
    raw = os.environ.get("GATEKEEPER_PCH_DIR", "").strip()
    if raw.lower() in ("off", "0"):
        return None
    if raw:
        return Path(raw).absolute()
    where = facts_cache.folder().parent / "headers"
    shared = [Path(tempfile.gettempdir()), Path("/dev/shm")]
    if any(where.resolve().is_relative_to(p.resolve()) for p in shared):
        return None
    return where


def _compiler() -> list[object]:
    """The C++ compiler inductor runs (``CXX``, else ``g++``): its name and file."""
    name = os.environ.get("CXX") or "g++"
    found = shutil.which(name)
    if not found:
        return [name]
    st = os.stat(found)
    return [name, os.path.realpath(found), st.st_size, st.st_mtime_ns]


def key() -> str | None:
    """What the headers follow from: the interpreter, torch's files and the CPU
    (:func:`gatekeeper.facts_cache.fingerprint`, less the thread settings), the
    compiler and inductor's settings from the environment. None without torch."""
    if facts_cache.fingerprint() is None:
        return None
    ignored = ("OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_")
    kept = {k: v for k, v in os.environ.items() if not k.startswith(ignored)}
    with _environ(kept):
        torch_and_cpu = facts_cache.fingerprint()
    inductor = sorted(  # inductor's settings, but where it keeps things
        (k, v)
        for k, v in os.environ.items()
        if k.startswith("TORCHINDUCTOR_") and not k.endswith("_DIR")
    )
    doc = [torch_and_cpu, _compiler(), inductor]
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:24]


@contextlib.contextmanager
def _environ(env: dict[str, str]):
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _owned(path: Path) -> bool:
    """A real folder of this user that nobody else may write."""
    try:
        st = path.lstat()
    except OSError:
        return False
    mine = not hasattr(os, "getuid") or st.st_uid == os.getuid()
    return stat.S_ISDIR(st.st_mode) and mine and not st.st_mode & 0o022


def ensure(boxed: Boxed) -> Path | None:
    """The shared folder, its headers built for this machine first if they are not
    (once per process, by ``boxed``'s worker: :func:`gatekeeper.boundary.spawn.headers_worker`);
    None where there is none or its build failed (each worker then builds its own:
    slower, still right)."""
    where, k = folder(), key()
    if where is None or k is None:
        return None
    if k in _tried:
        return _tried[k]
    _tried[k] = None
    with contextlib.suppress(FileExistsError, OSError):
        where.mkdir(mode=0o755, parents=True)
    if not _owned(where):
        log.warning("precompiled headers not shared: %s is not a folder only you write", where)
        return None
    stamp, isa = where / f".built-{k}", where / f"isa-{k}"
    with _locked(where):
        # a folder stamped before the ISA check was kept is built again, once
        if not stamp.is_file() or not isa.is_dir():
            shutil.rmtree(where / _ISA_PART, ignore_errors=True)  # a killed build's
            if (why := _build(where, boxed)) is not None:
                log.warning("precompiled headers not shared (%s): each worker builds its own", why)
                return None
            shutil.rmtree(isa, ignore_errors=True)
            with contextlib.suppress(OSError):  # none kept (another torch): an empty one
                (where / _ISA_PART).mkdir(mode=0o755)
            os.rename(where / _ISA_PART, isa)
            _write_new(stamp, sys.version)
    _tried[k] = where
    _isa[where] = isa
    return where


def ready() -> Path | None:
    """The shared folder when its headers for this machine are built (nothing is built
    here: a service's :func:`gatekeeper.warm_start` stays light)."""
    where, k = folder(), key()
    if where is None or k is None or not _owned(where):
        return None
    return where if (where / f".built-{k}").is_file() else None


@contextlib.contextmanager
def _locked(where: Path):
    """One builder at a time on this machine (another gatekeeper waits, then finds the
    stamp)."""
    fd = os.open(where / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_new(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".stamp-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _build(where: Path, boxed: Boxed) -> str | None:
    """Run :mod:`gatekeeper.worker.headers` in its box (``boxed``: its command line and
    environment), ``where`` its one writable folder besides its scratch; why it failed,
    or None."""
    with scratch_dir("gk-headers-") as tmp:
        cmd, env = boxed(where, Path(tmp))
        # a box that cannot be made is no reason to build each worker's own: it ends
        # the run here, in one line (BoxUnavailable), before any model code runs
        started = box.start(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            _, err = started.popen.communicate(timeout=_TIMEOUT)
        except subprocess.TimeoutExpired:
            started.popen.kill()
            started.popen.wait()
            return f"timed out after {_TIMEOUT:.0f} s"
        finally:
            started.close()
        if started.popen.returncode != 0:
            lines = err.decode(errors="replace").strip().splitlines()
            return f"exit {started.popen.returncode}: {lines[-1] if lines else 'no output'}"
    return None


def _user(env: Mapping[str, str]) -> str:
    """The user name torch names its temp folder after in a process with ``env``."""
    name = next((env[v] for v in _USER_VARS if env.get(v)), None) or getpass.getuser()
    return re.sub(r'[\\/:*?"<>|]', "_", name)


_HEADER = re.compile(r"[A-Za-z0-9_.-]+\.h(\.gch)?")


def lend(where: Path | None, tmp: Path, env: Mapping[str, str], copy: bool = False) -> int:
    """Put the headers of ``where`` where inductor looks for them in a process whose
    temp dir is ``tmp`` (``<tmp>/torchinductor_<user>/precompiled_headers``): linked
    (a worker's scratch, which ends with the run), or ``copy``-ed (a service's temp dir,
    which outlives the folder's files: a dangling link there would fail its next header
    build). A name already there is left as it is. The number put there."""
    if where is None:
        return 0
    dest = tmp / f"torchinductor_{_user(env)}" / "precompiled_headers"
    try:
        names = [e.name for e in os.scandir(where) if e.is_file(follow_symlinks=False)]
        for part in (dest.parent, dest):
            with contextlib.suppress(FileExistsError):
                part.mkdir(mode=0o700)
            if not _owned(part):  # another's, or a link: lend nothing
                return 0
    except OSError:
        return 0
    put = 0
    for name in names:
        if not _HEADER.fullmatch(name) or os.path.lexists(dest / name):
            continue
        with contextlib.suppress(OSError):
            if copy:
                _copy_new(where / name, dest / name)
            else:
                os.symlink(where / name, dest / name)
            put += 1
    if not copy and env.get("TORCHINDUCTOR_CACHE_DIR") and where in _isa:
        _lend_isa_check(_isa[where], Path(env["TORCHINDUCTOR_CACHE_DIR"]))
    return put


def _lend_isa_check(isa: Path, cache: Path) -> None:
    """Copy the ISA check the header worker kept (:func:`gatekeeper.worker.headers.keep_isa_check`)
    into a worker's cache dir, where inductor looks for it before it builds one: a copy
    per worker, filled as a bundle is (a worker of the run may have written the cache
    dir before: its links are replaced, never followed)."""
    from ..bundle import install_tree

    with contextlib.suppress(OSError, ValueError):
        install_tree(isa, cache)


def _copy_new(src: Path, dest: Path) -> None:
    """``src`` copied to ``dest`` through a new file beside it, then renamed (a reader
    never sees half a header)."""
    part = dest.with_name(f".gk-{os.getpid()}-{dest.name}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(part, flags, 0o644)
    try:
        with open(src, "rb") as f, os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(f, out, 2**20)
        os.rename(part, dest)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
