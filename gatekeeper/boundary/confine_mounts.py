"""The box's filesystem, ``/dev``, ``/proc`` and pids cgroup (:mod:`confine`, which runs
this module by its folder, without ``site``: standard library only).

In the mount namespace the supervisor just entered: every mount read-only, ``nodev``
and ``nosuid`` but the kernel's own (``/proc``, ``/dev``); a fresh ``/dev`` (a tmpfs,
read-only once made) holding only :data:`DEV_NODES`, the ``--device`` nodes (a GPU's),
the links programs expect and a ``/dev/shm`` of its own that dies with the box; then the
``--writable`` and ``--read-only`` folders bound onto themselves, outer first, so the
deeper one decides.
"""

from __future__ import annotations

import ctypes
import os
import time

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
# a remount must keep the flags the kernel locked on the mount: statvfs's -> mount's
KEPT_FLAGS = {2: 2, 4: 4, 8: 8, 1024: 1024, 2048: 2048, 4096: 1 << 21}
KERNEL_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger")
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_LINKS = {
    "fd": "/proc/self/fd",
    "stdin": "/proc/self/fd/0",
    "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2",
}
CGROUP_PREFIX = "gatekeeper-box-"


def _mount_points() -> list[str]:
    """Every mount point of this namespace, outer first."""
    points = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            raw = line.split()[4]
            points.append(raw.decode("unicode_escape").encode("latin-1").decode(errors="replace"))
    return sorted(set(points), key=lambda p: (p.count("/"), p))


def remounted(prefix: str) -> bool:
    """Whether anything is mounted below ``prefix`` (a masked ``/proc`` entry)."""
    try:
        return any(p.startswith(prefix + "/") for p in _mount_points())
    except OSError:
        return True


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _kernels(point: str) -> bool:
    return _under(point, "/proc") or _under(point, "/dev")


def _mount(libc: ctypes.CDLL, path: str, read_only: bool, source: str | None = None) -> bool:
    """(Bind ``source`` onto ``path``, then) remount it read-only or writable, ``nodev``
    and ``nosuid``, keeping the flags the kernel locked."""
    raw = path.encode()
    try:
        flags = os.statvfs(source or path).f_flag
    except OSError:
        return False
    kept = sum(ms for st, ms in KEPT_FLAGS.items() if flags & st) | MS_NOSUID | MS_NODEV
    if source and libc.mount(source.encode(), raw, None, MS_BIND | MS_REC, None) != 0:
        return False
    how = MS_BIND | MS_REMOUNT | kept | (MS_RDONLY if read_only else 0)
    return libc.mount(None, raw, None, how, None) == 0


def _writable(path: str) -> bool:
    try:
        return not os.statvfs(path).f_flag & os.ST_RDONLY
    except OSError:
        return False


def _errno(what: str) -> str:
    err = ctypes.get_errno()
    return f"{what}: {os.strerror(err)}" if err else what


def filesystem(libc: ctypes.CDLL, box) -> None:
    """Make the box's filesystem (the module doc) in the mount namespace this process
    just entered; a step the kernel refuses goes to ``box.step``."""
    opts = box.opts
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:  # nothing leaks out
        box.step(False, _errno("cannot make the mounts private"))
        return
    for point in _mount_points():
        if not _kernels(point) and not _mount(libc, point, True) and _writable(point):
            box.step(False, _errno(f"cannot make {point} read-only"))
    places = {(p, False) for p in opts.writable} | {(p, True) for p in opts.read_only}
    held = {}  # what /dev held, by path, opened before the box's own /dev covers it
    for path in [*(f"/dev/{n}" for n in DEV_NODES), *opts.devices, *(p for p, _ in places)]:
        if _under(path, "/dev") and path not in held:
            try:
                held[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
    try:
        fresh_dev(libc, box, held)
        for path, ro in sorted(places, key=lambda pr: (pr[0].rstrip("/").count("/"), pr[1])):
            source = f"/proc/self/fd/{held[path]}" if path in held else path
            if not _mount(libc, path, ro, source) and ro and os.path.exists(source):
                box.step(False, _errno(f"cannot make {path} read-only"))
    finally:
        for fd in held.values():
            os.close(fd)
    how = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
    box.step(libc.mount(None, b"/dev", None, how, None) == 0, _errno("cannot seal /dev"))
    for path in KERNEL_READ_ONLY:  # the host's /proc until the init mounts its own
        if os.path.exists(path) and not _mount(libc, path, True, path):
            box.step(False, _errno(f"cannot make {path} read-only"))
    try:  # the current directory was below the new mounts: walk to it through them
        os.chdir(os.getcwd())
    except OSError as e:
        box.step(False, f"cannot enter the current directory again: {e.strerror}")


def release(libc: ctypes.CDLL, places: list[str], folders: list[str]) -> None:
    """Detach this namespace's mounts of ``places`` that lie in one of ``folders``,
    deepest first: a folder that is a mount point in the caller's own namespace cannot be
    removed (EBUSY), not even through the host's mounts, so the supervisor's clean-up of
    the scratch folders left the box's own folders in them behind."""
    tops = [os.path.realpath(folder) for folder in folders]
    for path in sorted(places, key=lambda p: -p.rstrip("/").count("/")):
        if any(_under(os.path.realpath(path), top) for top in tops):
            libc.umount2(path.encode(), MNT_DETACH)


def fresh_dev(libc: ctypes.CDLL, box, held: dict[str, int]) -> None:
    """A tmpfs over ``/dev`` holding the nodes of ``held`` (each bound from the open
    descriptor of the host's), the links programs expect, a ``/dev/shm`` of its own,
    and the mount points of the box's folders that lie under ``/dev``."""
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if libc.mount(b"tmpfs", b"/dev", b"tmpfs", flags, b"mode=0755,size=1m") != 0:
        box.step(False, _errno("cannot mount a /dev of its own"))
        return
    for name, target in DEV_LINKS.items():
        os.symlink(target, f"/dev/{name}")
    os.mkdir("/dev/shm", 0o1777)
    if libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=1777") != 0:
        box.step(False, _errno("cannot mount a /dev/shm of its own"))
    nodes = {f"/dev/{n}" for n in DEV_NODES} | set(box.opts.devices)
    for path, fd in sorted(held.items()):
        folder = os.path.isdir(f"/proc/self/fd/{fd}")
        if not os.path.lexists(path):
            os.makedirs(path if folder else os.path.dirname(path), exist_ok=True)
            if not folder:
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
        if path in nodes:
            source = f"/proc/self/fd/{fd}".encode()
            if libc.mount(source, path.encode(), None, MS_BIND | MS_REC, None) != 0:
                box.step(False, _errno(f"cannot put {path} in the box's /dev"))


def mount_proc(libc: ctypes.CDLL, box) -> None:
    """A ``/proc`` of this PID namespace (only its processes), its ``sys`` read-only."""
    if libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
        why = _errno("cannot mount a /proc of its own")
        if remounted("/proc"):
            why += " (/proc has paths mounted over it: a container's masked paths)"
        box.step(False, why)
        return
    for path in KERNEL_READ_ONLY:
        if os.path.exists(path) and not _mount(libc, path, True, path):
            box.step(False, _errno(f"cannot make {path} read-only"))


# -- the pids cgroup ------------------------------------------------------------------------
def _cgroup_dir() -> str | None:
    """This process's cgroup folder in the hierarchy that has the pids controller (v1's
    ``pids``; else v2's, where its subtree already has it), or None."""
    own = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            own[controllers] = path
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            at, kind, options = fields[4], *fields[fields.index("-") + 1 :: 2][:2]
            if kind == "cgroup" and "pids" in options.split(","):
                where = next((p for c, p in own.items() if "pids" in c.split(",")), None)
                if where is not None:
                    return at + where
            if kind == "cgroup2" and "" in own:
                folder = at + own[""]
                try:
                    with open(os.path.join(folder, "cgroup.subtree_control")) as g:
                        if "pids" in g.read().split():
                            return folder
                except OSError:
                    continue
    return None


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


class Cgroup:
    """The box's pids cgroup: its folder, and what the supervisor needs to leave and
    remove it, opened before the filesystem became read-only (the host's mounts)."""

    def __init__(self, folder: str, parent_fd: int, procs_fd: int) -> None:
        self.folder, self.parent_fd, self.procs_fd = folder, parent_fd, procs_fd

    def close(self) -> None:
        """In the box's init: nothing of the cgroup's above the box stays open."""
        for fd in (self.parent_fd, self.procs_fd):
            os.close(fd)

    def leave(self) -> None:
        """Move this process back to the cgroup above the box's, and remove the box's."""
        try:
            os.write(self.procs_fd, str(os.getpid()).encode())
        except OSError:
            return
        _remove(os.path.basename(self.folder), self.parent_fd)


def pids_cgroup(most: int) -> Cgroup | None:
    """A new pids cgroup of at most ``most`` tasks, holding this process (its children,
    the box, are born in it); None where none can be made."""
    try:
        parent = _cgroup_dir()
    except (OSError, ValueError, IndexError):
        return None
    if parent is None or not os.access(parent, os.W_OK):
        return None
    _sweep(parent)
    name = f"{CGROUP_PREFIX}{os.getpid()}"
    folder = os.path.join(parent, name)
    try:
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        os.mkdir(name, 0o755, dir_fd=parent_fd)
        procs_fd = os.open("cgroup.procs", os.O_WRONLY | os.O_CLOEXEC, dir_fd=parent_fd)
    except OSError:
        _remove(name, parent_fd)
        os.close(parent_fd)
        return None
    try:
        _write(os.path.join(folder, "pids.max"), str(most))
        _write(os.path.join(folder, "cgroup.procs"), str(os.getpid()))
    except OSError:
        _remove(name, parent_fd)
        for fd in (parent_fd, procs_fd):
            os.close(fd)
        return None
    return Cgroup(folder, parent_fd, procs_fd)


def _sweep(parent: str) -> None:
    """Remove the cgroups of boxes whose supervisor was killed (an empty one only)."""
    try:
        names = [n for n in os.listdir(parent) if n.startswith(CGROUP_PREFIX)]
    except OSError:
        return
    for name in names:
        pid = name[len(CGROUP_PREFIX) :]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                os.rmdir(os.path.join(parent, name))
            except OSError:
                continue


def _remove(name: str, parent_fd: int, tries: int = 50) -> None:
    for _ in range(tries):  # a killed task leaves its cgroup a moment after it died
        try:
            os.rmdir(name, dir_fd=parent_fd)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


def open_events(cgroup: Cgroup | None) -> int | None:
    """The open ``pids.events`` of the box's cgroup, or None."""
    if cgroup is None:
        return None
    try:
        return os.open(os.path.join(cgroup.folder, "pids.events"), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def refused_forks(events: int) -> int:
    """How many forks the cgroup refused so far (``max N`` of its ``pids.events``)."""
    for line in os.pread(events, 256, 0).decode().splitlines():
        name, _, count = line.partition(" ")
        if name == "max" and count.strip().isdigit():
            return int(count)
    return 0
