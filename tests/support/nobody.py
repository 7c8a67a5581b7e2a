"""Run a command as ``nobody`` where the kernel gives it no user namespace (a test of
gatekeeper's box failing closed: docs/hardening.md, "Getting a box"). Run as root:
``python nobody.py [--user-namespaces] [--mask-proc] -- PROGRAM ARGS...``.

1. A mount namespace of its own, where ``/root`` (0700 here, and the home of this
   machine's Python) is a tmpfs holding the original ``/root/.pyenv`` (bound from a
   descriptor opened before it was covered), so ``nobody`` can run this Python; with
   ``--mask-proc``, a file of ``/proc`` covered as a container's masked paths are.
2. A child in a user namespace of its own mapping uids and gids 0-65535 to themselves,
   whose ``user.max_user_namespaces`` is 0 (unless ``--user-namespaces``): what
   Ubuntu's restriction or a seccomp profile leaves a runner's user.
3. That child becomes ``nobody`` (65534), with no capability, and execs PROGRAM.

Standard library only; the exit status is PROGRAM's."""

from __future__ import annotations

import ctypes
import os
import sys

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
NOBODY = 65534


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
    return libc


def _check(ok: bool, what: str) -> None:
    if not ok:
        sys.exit(f"nobody.py: {what}: {os.strerror(ctypes.get_errno())}")


def _mounts(libc: ctypes.CDLL, mask_proc: bool) -> None:
    _check(libc.unshare(CLONE_NEWNS) == 0, "unshare(CLONE_NEWNS)")
    _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) == 0, "make / private")
    pyenv = os.open("/root/.pyenv", os.O_PATH)
    _check(libc.mount(b"tmpfs", b"/root", b"tmpfs", 0, b"mode=0755") == 0, "tmpfs on /root")
    os.mkdir("/root/.pyenv")
    source = f"/proc/self/fd/{pyenv}".encode()
    _check(libc.mount(source, b"/root/.pyenv", None, MS_BIND | MS_REC, None) == 0, "bind .pyenv")
    os.close(pyenv)
    if mask_proc:
        _check(libc.mount(b"/dev/null", b"/proc/keys", None, MS_BIND, None) == 0, "mask /proc")


def main(argv: list[str]) -> int:
    flags = set(argv[: argv.index("--")])
    program = argv[argv.index("--") + 1 :]
    libc = _libc()
    _mounts(libc, "--mask-proc" in flags)
    go_r, go_w = os.pipe()
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(go_w)
        os.close(ready_r)
        _check(libc.unshare(CLONE_NEWUSER) == 0, "unshare(CLONE_NEWUSER)")
        os.write(ready_w, b"x")
        os.read(go_r, 1)  # mapped
        if "--user-namespaces" not in flags:
            with open("/proc/sys/user/max_user_namespaces", "w") as f:
                f.write("0")
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)  # no capability left
        os.execvp(program[0], program)
    os.close(go_r)
    os.close(ready_w)
    os.read(ready_r, 1)
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{child}/{name}", "w") as f:
            f.write("0 0 65536")
    os.write(go_w, b"x")
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
