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

from .. import facts_cache, safefs
from ..scratch import scratch_dir
from . import box

log = logging.getLogger("gatekeeper.headers")
_TIMEOUT = 900.0
# the header worker's command line and environment, given its folder and scratch
Boxed = Callable[[Path, Path, tuple[str, ...]], tuple[list[str], dict[str, str]]]
_USER_VARS = ("LOGNAME", "USER", "LNAME", "USERNAME")  # what getpass.getuser() reads
_tried: dict[tuple[str, str], Path | None] = {}  # (key, part) -> the folder; None: failed
_isa: dict[Path, Path] = {}  # the folder -> its ISA check for this process's key
# the header worker's staging names, shared with it (gatekeeper.worker.headers):
ISA_PART = "isa.part"  # where it leaves the ISA check, for the parent to name by its key
USED = "used.json"  # in a part's staging folder: the headers its build asked inductor for
# what a folder of this key holds, in the key: a folder that kept less is built again once
# (2: every ISA check program, not the vector ISA's own only)
LAYOUT = 2


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
    compiler and inductor's settings from the environment, and what the folder keeps
    (:data:`LAYOUT`). None without torch."""
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
    doc = [torch_and_cpu, _compiler(), inductor, LAYOUT]
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


def ensure(boxed: Boxed, parts: tuple[str, ...] = (), forkable: bool = False) -> Path | None:
    """The shared folder, its headers built for this machine first if they are not
    (once per process, by ``boxed``'s worker: :func:`gatekeeper.boundary.spawn.headers_worker`);
    None where there is none or its build failed (each worker then builds its own:
    slower, still right). ``parts``: the headers a worker's kind builds beyond the JIT
    kernels' (:attr:`gatekeeper.kinds.base.Kind.headers`: ``aoti``), built the first
    time a run asks for them; where they fail, only that kind's workers build their own.
    ``forkable``: the header worker may be forked from the warm server the run's model
    workers are forked from (:func:`gatekeeper.boundary.box.start`), which then imports
    torch once for both: a run that forks its workers passes it."""
    where, k = folder(), key()
    if where is None or k is None:
        return None
    todo = [p for p in ("kernels", *parts) if (k, p) not in _tried]
    if todo:
        for part in todo:
            _tried[k, part] = None
        with contextlib.suppress(FileExistsError, OSError):
            where.mkdir(mode=0o755, parents=True)
        if not _owned(where):
            log.warning("precompiled headers not shared: %s is not a folder only you write", where)
            return None
        with _locked(where):
            for part in todo:  # one build each: a stamp names the headers its part built
                if not _built(where, k, part):
                    for staged in (ISA_PART, f"{part}.part"):  # a killed build's
                        shutil.rmtree(where / staged, ignore_errors=True)
                    _seed(where, where / f"{part}.part")
                    if (why := _build(where, boxed, (part,), forkable)) is not None:
                        log.warning(
                            "precompiled headers not shared (%s): each worker builds its own",
                            why,
                        )
                        continue
                    _stamp(where, k, part)
                _tried[k, part] = where
    if _tried[k, "kernels"] is None:
        return None
    _isa[where] = where / f"isa-{k}"
    return where


def _stamp_path(where: Path, k: str, part: str) -> Path:
    return where / (f".built-{k}" if part == "kernels" else f".built-{part}-{k}")


def _built(where: Path, k: str, part: str) -> bool:
    """Whether ``part`` of the folder is built for key ``k`` (a folder stamped before the
    ISA check was kept, before stamps named their headers, or before a part existed, is
    built again once: the headers it has are used, not built again)."""
    if part == "kernels" and not (where / f"isa-{k}").is_dir():
        return False
    return _names(where, k, part) is not None  # an older stamp names no headers


def _stamp(where: Path, k: str, part: str) -> None:
    """Move what the header worker built for ``part`` (``<part>.part/``) into the folder
    (a header of the same name already there is the same header: inductor names one by
    its command line, its preprocessed text and its compiler) and mark the part built,
    with the names of its headers (what :func:`lend` lends)."""
    staged = where / f"{part}.part"
    names = []
    try:  # the headers its build asked for (written by the header worker, no model's)
        used = json.loads((staged / USED).read_text())
    except (OSError, ValueError):
        used = []
    for header in used if isinstance(used, list) else ():
        for name in (str(header), f"{header}.gch"):
            entry = staged / name
            if not _HEADER.fullmatch(name):
                continue
            with contextlib.suppress(OSError):
                if _plain(entry) and not os.path.lexists(where / name):
                    os.rename(entry, where / name)
            if _plain(where / name):
                names.append(name)
    shutil.rmtree(staged, ignore_errors=True)
    if part == "kernels":
        isa = where / f"isa-{k}"
        shutil.rmtree(isa, ignore_errors=True)
        with contextlib.suppress(OSError):  # none kept (another torch): an empty one
            (where / ISA_PART).mkdir(mode=0o755)
        os.rename(where / ISA_PART, isa)
    doc = {"python": sys.version, "headers": sorted(names)}
    _write_new(_stamp_path(where, k, part), json.dumps(doc))


def _seed(where: Path, staged: Path) -> None:
    """Link every header of the folder into a part's staging folder before its build: a
    header another key built under the same name (the same command line, text and
    compiler: another venv of the same torch) is found there, not built again, and
    still named in the new part's stamp."""
    with contextlib.suppress(OSError):
        staged.mkdir(mode=0o755)
        for entry in os.scandir(where):
            if _HEADER.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                os.symlink(where / entry.name, staged / entry.name)


def _names(where: Path, k: str, part: str) -> list[str] | None:
    """The headers the stamp of ``part`` names; None for a stamp written before stamps
    named them (then every header of the folder is lent, as then)."""
    try:
        doc = json.loads(_stamp_path(where, k, part).read_text())
    except (OSError, ValueError):
        return None
    names = doc.get("headers") if isinstance(doc, dict) else None
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else None


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


def _build(where: Path, boxed: Boxed, parts: tuple[str, ...], forkable: bool) -> str | None:
    """Run :mod:`gatekeeper.worker.headers` for ``parts`` in its box (``boxed``: its
    command line and environment), ``where`` its one writable folder besides its
    scratch, forked from a warm server where ``forkable`` and one can start, else a
    fresh process; why it failed, or None."""
    with scratch_dir("gk-headers-") as tmp:
        cmd, env = boxed(where, Path(tmp), parts)
        log_path = Path(tmp) / "headers.log"  # the run's folder, not the worker's
        # a box that cannot be made is no reason to build each worker's own: it ends
        # the run here, in one line (BoxUnavailable), before any model code runs
        with safefs.new_file(log_path) as log:
            started = box.start(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                forkable=forkable,
            )
        try:
            started.proc.wait(_TIMEOUT)
        except subprocess.TimeoutExpired:
            started.proc.kill()
            started.proc.wait()
            return f"timed out after {_TIMEOUT:.0f} s"
        finally:
            started.close()
        if started.proc.returncode != 0:
            lines = safefs.read_tail(log_path).strip().splitlines()
            return f"exit {started.proc.returncode}: {lines[-1] if lines else 'no output'}"
    return None


def _user(env: Mapping[str, str]) -> str:
    """The user name torch names its temp folder after in a process with ``env``."""
    name = next((env[v] for v in _USER_VARS if env.get(v)), None) or getpass.getuser()
    return re.sub(r'[\\/:*?"<>|]', "_", name)


_HEADER = re.compile(r"[A-Za-z0-9_.-]+\.h(\.gch)?")


def lend(
    where: Path | None,
    tmp: Path,
    env: Mapping[str, str],
    copy: bool = False,
    parts: tuple[str, ...] = (),
) -> int:
    """Put the headers of ``where`` where inductor looks for them in a process whose
    temp dir is ``tmp`` (``<tmp>/torchinductor_<user>/precompiled_headers``): linked
    (a worker's scratch, which ends with the run), or ``copy``-ed (a service's temp dir,
    which outlives the folder's files: a dangling link there would fail its next header
    build). Lent: the headers this machine's key built (the folder keeps other torch
    builds' and interpreters' too): the JIT kernels', and those of ``parts`` (the ones
    the worker's kind asked :func:`ensure` for; a part whose build failed has none).
    A name already there is left as it is. The number put there."""
    if where is None:
        return 0
    dest = tmp / f"torchinductor_{_user(env)}" / "precompiled_headers"
    k = key()
    named = [_names(where, k, part) if k else None for part in ("kernels", *parts)]
    try:
        if named[0] is not None:
            names = sorted({name for n in named for name in n or ()})
        else:  # a stamp of an older gatekeeper: every header, as it lent them
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
        src = where / name
        if not _HEADER.fullmatch(name) or os.path.lexists(dest / name) or not _plain(src):
            continue
        with contextlib.suppress(OSError):
            if copy:
                _copy_new(src, dest / name)
            else:
                os.symlink(src, dest / name)
            put += 1
    if not copy and env.get("TORCHINDUCTOR_CACHE_DIR") and where in _isa:
        lend_isa_check(_isa[where], Path(env["TORCHINDUCTOR_CACHE_DIR"]))
    return put


def _plain(path: Path) -> bool:
    """A plain file (not a link), there."""
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def isa_check(where: Path | None) -> Path | None:
    """The ISA check the header worker kept in ``where`` for this machine's key (the
    folder :func:`ensure` returned), where it holds one."""
    isa = _isa.get(where) if where is not None else None
    return isa if isa is not None and isa.is_dir() else None


def lent_isa_files() -> set[str]:
    """Every file of the ISA checks this process lends its workers, as a path in a
    cache dir: a compile ships them whether or not its process read them (a worker
    forked from a server that ran the check has its answer, not the files' reads), so a
    deploy warmed from its bundle builds none."""
    names: set[str] = set()
    for isa in _isa.values():
        with contextlib.suppress(OSError):
            names |= {p.relative_to(isa).as_posix() for p in isa.rglob("*") if _plain(p)}
    return names


def lend_isa_check(isa: Path, cache: Path) -> None:
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
