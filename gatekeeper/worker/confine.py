"""What a worker starts as on Linux: ``python -I -S confine.py PROGRAM ARGS...`` takes
from this process what would let code read another process's memory or environment,
then execs PROGRAM (the worker) in its place, before any code of the model or of its
site-packages runs. Python's standard library only, run without ``site``: no ``.pth``
file of any site-packages runs before these steps.

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
CAP_VERSION_3 = 0x20080522
DROPPED = {
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


def own_user_namespace(libc: ctypes.CDLL) -> bool:
    """Move into a new user namespace, this uid and gid mapped to themselves."""
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER) != 0:
        _say(f"no user namespace of its own (errno {ctypes.get_errno()})")
        return False
    maps = (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1"))
    for name, text in maps:
        try:
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        except OSError as e:
            _say(f"cannot write /proc/self/{name}: {e}")
    return True


def confine() -> None:
    """The steps of the module doc, in order."""
    libc = _libc()
    privileged = drop_capabilities(libc)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _say(f"cannot set no_new_privs (errno {ctypes.get_errno()})")
    if not privileged and os.geteuid() != 0:
        own_user_namespace(libc)


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python -I -S confine.py PROGRAM [ARGS...]")
    confine()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
