"""What a model is really built from, recorded while the worker builds it (no torch here).

While the factory builds the model (and the inputs factory its inputs), an audit hook
(``sys.addaudithook``) sees every file opened and every import attempted. Afterwards:

* **modules**: every module imported during the build, plus the factories' own modules
  and the modules of the model's classes (and their bases), even when already loaded.
  A module of the interpreter's own library is left out; a module that an installed
  distribution's ``RECORD`` lists is named by that distribution (name and version, not
  its files); anything else — the user's code, wherever it lives — is hashed by content
  and named by its module name, so a checkout in another folder finds the same key.
* **files**: data files opened for reading while building, hashed (named relative to the
  config's folder when inside it, else by absolute path). Module sources and bytecode,
  ``/proc``, ``/sys``, ``/dev``, the inductor cache dir, the interpreter's library and
  distributions' own files are not data.
* **distributions**: name → version of every distribution the above belong to.
* **absent**: top-level modules the build tried to import and could not (``try: import
  x except ImportError``): installing one later changes what the code does.

The parent re-checks a recorded set without importing anything
(:func:`gatekeeper.key.resolve_deps`); the code hash is computed from it.
"""

from __future__ import annotations

import importlib.metadata
import os
import site
import stat
import sys
import sysconfig
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from ..hashing import locate, search_path, sha256_file

DEPS_FORMAT = 1
_SKIP_PREFIXES = ("/proc/", "/sys/", "/dev/")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


# -- where a file comes from -------------------------------------------------------------
def _writes(mode: object, flags: object) -> bool:
    """Whether an ``open`` audit event's mode or flags open the file for writing."""
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)


def _norm(path: str) -> str:
    return os.path.normpath(os.path.abspath(path))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


@lru_cache(maxsize=1)
def _site_dirs() -> tuple[str, ...]:
    dirs = {sysconfig.get_paths().get(k) for k in ("purelib", "platlib")}
    try:
        dirs.update(site.getsitepackages())
    except AttributeError:  # pragma: no cover - some embedded interpreters
        pass
    dirs.add(site.getusersitepackages())
    dirs.update(p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages"))
    return tuple(sorted(_norm(d) for d in dirs if d))


@lru_cache(maxsize=1)
def _stdlib_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(sorted({_norm(paths[k]) for k in ("stdlib", "platstdlib") if paths.get(k)}))


def is_stdlib(path: str) -> bool:
    path = _norm(path)
    return any(_under(path, d) for d in _stdlib_dirs()) and not any(
        _under(path, d) for d in _site_dirs()
    )


@cache
def _dist_index(entry: str) -> dict[str, tuple[str, str]]:
    """Top-level names in one sys.path entry -> (distribution, version), from the
    ``RECORD`` of each ``.dist-info`` there (egg-info lists sources, not installs)."""
    index: dict[str, tuple[str, str]] = {}
    for dist in importlib.metadata.distributions(path=[entry]):
        record = dist.read_text("RECORD")
        if not record:
            continue
        tops = {line.rsplit(",", 2)[0].strip('"').split("/", 1)[0] for line in record.splitlines()}
        tops = {t for t in tops if t and t != ".." and not t.endswith((".dist-info", ".data"))}
        meta = dist.metadata  # parsed once: it is an e-mail message
        name = meta["Name"] if meta else None
        if not name:
            continue
        for top in tops:
            index.setdefault(top, (name, meta["Version"]))
    return index


def owner(path: str, base_dir: Path | None = None) -> tuple[str, str] | None:
    """The installed distribution (name, version) whose RECORD lists ``path``, if any.

    The project's own files (under ``base_dir`` and not in a site-packages folder) never
    count as installed: an editable install's version does not change when its code does.
    """
    path = _norm(path)
    in_site = any(_under(path, d) for d in _site_dirs())
    if base_dir is not None and _under(path, _norm(str(base_dir))) and not in_site:
        return None
    entries = [e for e in (_norm(p) for p in sys.path if p) if _under(path, e) and e != path]
    for entry in sorted(set(entries), key=len, reverse=True):
        rel = os.path.relpath(path, entry)
        top = rel.split(os.sep, 1)[0]
        found = _dist_index(entry).get(top)
        if found:
            return found
    return None


# -- recording -----------------------------------------------------------------------------
class Recorder:
    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.before = set(sys.modules)
        self.opened: dict[str, None] = {}  # ordered set of absolute paths read
        self.attempted: dict[str, None] = {}
        self.extra: set[str] = set()  # modules that count even when loaded before

    def event(self, name: str, args: tuple) -> None:
        if name == "import":
            self.attempted[args[0]] = None
        elif name == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            if isinstance(path, int) or path is None:
                return
            if _writes(mode, flags):
                return
            try:
                self.opened[_norm(os.fsdecode(path))] = None
            except (TypeError, ValueError):
                return

    def note(self, *objects: Any, refs: Sequence[str] = ()) -> None:
        """Count the modules of these objects' classes (and bases) and of ``refs``."""
        self.extra.update(r.split(":", 1)[0] for r in refs)
        for obj in objects:
            children = obj.modules() if hasattr(obj, "modules") and callable(obj.modules) else [obj]
            for child in children:
                for cls in type(child).__mro__:
                    mod = getattr(cls, "__module__", None)
                    if isinstance(mod, str):
                        self.extra.add(mod)

    def finish(self) -> dict:
        modules: dict[str, str] = {}
        dists: dict[str, str] = {}
        module_files: set[str] = set()
        for name in sorted((set(sys.modules) - self.before) | self.extra):
            mod = sys.modules.get(name)
            spec = getattr(mod, "__spec__", None)
            origin = (
                getattr(spec, "origin", None)
                if spec and spec.has_location
                else getattr(mod, "__file__", None)
            )
            if not origin or not os.path.isfile(origin):
                continue
            origin = _norm(origin)
            if is_stdlib(origin):
                continue
            found = owner(origin, self.base_dir)
            if found:
                dists[found[0]] = found[1]
                continue
            modules[name] = sha256_file(Path(origin))
            module_files.add(origin)
        files: dict[str, str] = {}
        cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        # loaded code is not data (linecache and inspect read sources): it counted above
        loaded = {
            _norm(f)
            for m in list(sys.modules.values())
            if isinstance(f := getattr(m, "__file__", None), str)
        }
        for path in self.opened:
            if (
                path in module_files
                or path in loaded
                or path.startswith(_SKIP_PREFIXES)
                or "__pycache__" in path
                or path.endswith(".pyc")
                or (cache and _under(path, _norm(cache)))
            ):
                continue
            try:
                if not stat.S_ISREG(os.stat(path).st_mode):
                    continue
            except OSError:
                continue
            if is_stdlib(path):
                continue
            found = owner(path, self.base_dir)
            if found:
                dists[found[0]] = found[1]
                continue
            files[data_name(path, self.base_dir)] = sha256_file(Path(path))
        search = search_path(self.base_dir)
        absent = sorted(
            n
            for n in self.attempted
            if "." not in n and n not in sys.modules and not locate(n, search)[0]
        )
        return {
            "format": DEPS_FORMAT,
            "modules": modules,
            "files": files,
            "distributions": dict(sorted(dists.items())),
            "absent": absent,
        }


def data_name(path: str, base_dir: Path) -> str:
    """A data file's name in the key: relative to the config's folder when inside it."""
    base = _norm(str(base_dir))
    return (
        Path(os.path.relpath(path, base)).as_posix()
        if _under(path, base)
        else Path(path).as_posix()
    )


# -- what a compile used of its cache dir ---------------------------------------------------
# audit events whose arguments name a file the process reads, writes, loads or hands to a
# child: open (FX graph and AOTAutograd entries, generated .py), import (a kernel's .so
# loaded as an extension module), ctypes.dlopen, subprocess.Popen (inductor's vector-ISA
# probe loads its cached .so in a child), os.rename (os.replace too: an entry written)
_CACHE_EVENTS = frozenset(("open", "import", "ctypes.dlopen", "subprocess.Popen", "os.rename"))


class CacheUse:
    """Every file under ``roots`` (inductor cache dirs) that the process touched while
    watching, by path relative to its root: what a compile read, loaded or wrote there.

    A compile seeded with a previous bundle's cache dir ships only these and what it
    wrote (:mod:`gatekeeper.compile`); what it never touched stays behind."""

    def __init__(self, roots: Sequence[Path], *, reads_only: bool = False) -> None:
        import re

        self.reads_only = reads_only  # only files opened for reading, loaded or run
        self.roots = [_norm(str(r)) for r in roots]
        alternatives = "|".join(re.escape(r.rstrip(os.sep)) for r in self.roots)
        # a path under one of the roots, inside any string (a child's command line too)
        self._pattern = re.compile(rf"(?:{alternatives})/[^\s'\"(),;:]+")
        self.used: set[str] = set()
        self.failed = False  # an event could not be read: what was used is not known

    def _strings(self, value: Any) -> Iterator[str]:
        if isinstance(value, (str, bytes, os.PathLike)):
            try:
                yield os.fsdecode(value)
            except (TypeError, ValueError):
                return
        elif isinstance(value, (list, tuple)):
            for v in value:
                yield from self._strings(v)

    def event(self, name: str, args: tuple) -> None:
        if self.reads_only:
            if name == "os.rename":
                return
            if name == "open" and _writes(*(tuple(args) + (None, None))[1:3]):
                return
        for text in self._strings(args[:2] if name != "subprocess.Popen" else args[1:2]):
            for found in self._pattern.findall(text):
                path = os.path.normpath(found)
                for root in self.roots:
                    if _under(path, root) and path != root:
                        self.used.add(os.path.relpath(path, root).replace(os.sep, "/"))
                        break


_active: list[Recorder] = []
_watching: list[CacheUse] = []
_installed = False


def _hook(event: str, args: tuple) -> None:
    if _active and event in ("open", "import"):
        _active[-1].event(event, args)
    if _watching and event in _CACHE_EVENTS:
        for use in _watching:
            try:
                use.event(event, args)
            except Exception:  # a hook that raises fails the operation itself
                use.failed = True


def _install_hook() -> None:
    global _installed
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True


@contextmanager
def recording(base_dir: Path) -> Iterator[Recorder]:
    """Record what is imported and read inside the block (audit hooks cannot be removed:
    one is installed for the life of the process and is idle outside this block)."""
    _install_hook()
    rec = Recorder(base_dir)
    _active.append(rec)
    try:
        yield rec
    finally:
        _active.remove(rec)


@contextmanager
def watching_cache(*roots: Path, reads_only: bool = False) -> Iterator[CacheUse]:
    """Record which files under the cache dirs ``roots`` the block touches (``reads_only``:
    opened for reading, loaded or run; not written)."""
    _install_hook()
    use = CacheUse(roots, reads_only=reads_only)
    _watching.append(use)
    try:
        yield use
    finally:
        _watching.remove(use)
