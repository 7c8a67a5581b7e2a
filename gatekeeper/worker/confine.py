"""What a worker starts as on Linux: ``python -I -S confine.py [--read-only DIR]...
PROGRAM ARGS...`` takes from this process what would let code read another process's
memory or environment, or change the code its parent runs, then execs PROGRAM (the
worker) in its place, before any code of the model or of its site-packages runs.
Python's standard library only, run without ``site``: no ``.pth`` file of any
site-packages runs before these steps.

* **Read-only code**: in a mount namespace of its own, each ``--read-only DIR`` (the
  parent's Python installation, its import paths, gatekeeper's package: what the parent,
  which holds the signing key, imports later, and what the action's later steps run) is
  bound onto itself read-only, so model code cannot plant a ``.pth`` file or change a
  module there. As root this needs ``CAP_SYS_ADMIN``, which is dropped right after; not
  root, it comes with the user namespace below. Mounts copied into a namespace a less
  privileged process makes stay read-only (the kernel locks them).

* **As root** (or with any capability): :data:`DROPPED` leaves the bounding set (so no
  exec gives it back, root's included), and the inheritable, ambient, permitted and
  effective sets. Without ``CAP_SYS_PTRACE``, ``CAP_SYS_ADMIN`` and ``CAP_PERFMON``,
  root cannot read the ``environ`` or ``mem`` of a process that is not dumpable (the
  gatekeeper parent, :mod:`gatekeeper.secrecy`), nor of a root process holding more
  capabilities than it does (every ancestor: the runner, a shell); ``CAP_BPF``,
  ``CAP_SYS_RAWIO``, ``CAP_SYS_MODULE``, ``CAP_CHECKPOINT_RESTORE`` and the network's
  raw sockets are other ways to the same memory or traffic.
* **Not root**: a user namespace of its own, the user's uid and gid mapped to
  themselves (files, devices and groups work as before). From there no process outside
  it can be ptraced or have its ``environ``, ``mem`` or ``maps`` read, a dumpable
  ancestor of the same user included (the runner). Where the kernel refuses one
  (``user.max_user_namespaces = 0``, a seccomp profile) the worker runs without.
* **no_new_privs**: nothing the worker execs gains privileges (setuid, file capabilities).

A step the kernel refuses is skipped and named on stderr; the exec always happens.
"""

from __future__ import annotations

import ctypes
import os
import sys

PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
# a remount must keep the flags the kernel locked on the mount: statvfs's -> mount's
KEPT_FLAGS = {2: 2, 4: 4, 8: 8, 1024: 1024, 2048: 2048, 4096: 1 << 21}
CAP_VERSION_3 = 0x20080522
DROPPED = {
    "CAP_DAC_READ_SEARCH": 2,  # open_by_handle_at: a file by its handle, around a mount
    "CAP_NET_ADMIN": 12,
    "CAP_NET_RAW": 13,
    "CAP_SYS_MODULE": 16,
    "CAP_SYS_RAWIO": 17,
    "CAP_SYS_PTRACE": 19,
    "CAP_SYS_ADMIN": 21,
    "CAP_PERFMON": 38,
    "CAP_BPF": 39,
    "CAP_CHECKPOINT_RESTORE": 40,
}


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _say(what: str) -> None:
    sys.stderr.write(f"gatekeeper worker: {what}\n")


def _capabilities(libc: ctypes.CDLL) -> tuple[_Header, ctypes.Array] | None:
    header, data = _Header(CAP_VERSION_3, 0), (_Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        return None
    return header, data


def drop_capabilities(libc: ctypes.CDLL) -> bool:
    """:data:`DROPPED` out of every set; True when this process held any capability."""
    got = _capabilities(libc)
    if got is None:
        _say(f"capget failed (errno {ctypes.get_errno()}): capabilities kept")
        return False
    header, data = got
    held = any(d.permitted or d.effective for d in data)
    if not held:
        return False
    for cap in DROPPED.values():  # needs CAP_SETPCAP: before it may leave the sets below
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            _say(f"cannot drop capability {cap} from the bounding set")
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in DROPPED.values():
        word, bit = divmod(cap, 32)
        for field in ("effective", "permitted", "inheritable"):
            setattr(data[word], field, getattr(data[word], field) & ~(1 << bit))
    header.version, header.pid = CAP_VERSION_3, 0
    if libc.capset(ctypes.byref(header), data) != 0:
        _say(f"capset failed (errno {ctypes.get_errno()})")
    return True


def read_only(libc: ctypes.CDLL, dirs: list[str]) -> list[str]:
    """In the mount namespace this process just entered, bind each of ``dirs`` onto
    itself read-only; returns those done."""
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:  # nothing leaks out
        _say(f"cannot make the mounts private (errno {ctypes.get_errno()}): code left writable")
        return []
    done = []
    for folder in dirs:
        path = folder.encode()
        try:
            flags = os.statvfs(folder).f_flag
        except OSError:
            continue
        kept = sum(ms for st, ms in KEPT_FLAGS.items() if flags & st)
        if (
            libc.mount(path, path, None, MS_BIND | MS_REC, None) != 0
            or libc.mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | kept, None) != 0
        ):
            _say(f"cannot make {folder} read-only (errno {ctypes.get_errno()})")
            continue
        done.append(folder)
    return done


def own_user_namespace(libc: ctypes.CDLL, dirs: list[str]) -> bool:
    """Move into a new user namespace, this uid and gid mapped to themselves, with a
    mount namespace where ``dirs`` are read-only."""
    uid, gid = os.getuid(), os.getgid()
    mounts = bool(dirs) and libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0
    if not mounts and libc.unshare(CLONE_NEWUSER) != 0:
        _say(f"no user namespace of its own (errno {ctypes.get_errno()})")
        return False
    maps = (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1"))
    for name, text in maps:
        try:
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        except OSError as e:
            _say(f"cannot write /proc/self/{name}: {e}")
    if mounts:
        read_only(libc, dirs)
    return True


def confine(dirs: list[str]) -> None:
    """The steps of the module doc, in order; ``dirs``: what becomes read-only."""
    libc = _libc()
    got = _capabilities(libc)
    if got is not None and any(d.effective for d in got[1]):
        if dirs and libc.unshare(CLONE_NEWNS) == 0:  # while CAP_SYS_ADMIN is still held
            read_only(libc, dirs)
        elif dirs:
            _say(f"no mount namespace of its own (errno {ctypes.get_errno()}): code writable")
    privileged = drop_capabilities(libc)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _say(f"cannot set no_new_privs (errno {ctypes.get_errno()})")
    if not privileged and os.geteuid() != 0:
        own_user_namespace(libc, dirs)


def main(argv: list[str]) -> None:
    dirs = []
    while len(argv) > 1 and argv[0] == "--read-only":
        dirs.append(argv[1])
        argv = argv[2:]
    if not argv:
        sys.exit("usage: python -I -S confine.py [--read-only DIR]... PROGRAM [ARGS...]")
    confine(dirs)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
