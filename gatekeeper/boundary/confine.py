"""What a worker starts as on Linux: ``python -I -S confine.py [OPTION]... -- PROGRAM
ARGS...`` puts PROGRAM (the worker, or a distributed target's launcher) in a box before
any code of the model or of its site-packages runs, and stays outside it as its
supervisor. Standard library only, run without ``site``.

The box: its own mount and PID namespaces (a user namespace too when not root;
``--private-net``: a network namespace with only ``lo``); the filesystem read-only but
the ``--writable`` folders, and each ``--read-only`` folder read-only again inside them
(the deeper folder decides); PROGRAM under an init of its own, so no process outlives
the box; the init dies with this supervisor and the supervisor with its parent
(``--parent PID`` gone: every ``--scratch DIR`` is removed); SIGTERM, SIGINT and SIGHUP
passed on; as root, :data:`DROPPED` gone from every capability set; ``no_new_privs``.
A step the kernel refuses is skipped and named on stderr; the exec always happens.
What each step keeps out, and why not bubblewrap: docs/hardening.md.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
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
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
Run = Callable[[list[str]], int]  # PROGRAM's arguments -> its exit code


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


MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE, MNT_DETACH = 4096, 16384, 1 << 18, 2
# a remount must keep the flags the kernel locked on the mount: statvfs's -> mount's
KEPT_FLAGS = {2: 2, 4: 4, 8: 8, 1024: 1024, 2048: 2048, 4096: 1 << 21}
KERNEL_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger")


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


def _mount(libc: ctypes.CDLL, path: str, read_only: bool, bind: bool) -> bool:
    """(Bind ``path`` onto itself, then) remount it read-only or writable, keeping the
    flags the kernel locked."""
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
    raw = path.encode()
    try:
        flags = os.statvfs(path).f_flag
    except OSError:
        return False
    kept = sum(ms for st, ms in KEPT_FLAGS.items() if flags & st)
    if bind and libc.mount(raw, raw, None, MS_BIND | MS_REC, None) != 0:
        return False
    how = MS_BIND | MS_REMOUNT | kept | (MS_RDONLY if read_only else 0)
    return libc.mount(None, raw, None, how, None) == 0


def filesystem(libc: ctypes.CDLL, read_only: list[str], writable: list[str], say=_say) -> None:
    """In the mount namespace this process just entered: every mount read-only but the
    kernel's own (``/proc``, ``/dev``); then ``writable`` and ``read_only`` folders
    bound onto themselves, outer first, so the deeper one decides (a read-only one wins
    a tie)."""
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:  # nothing leaks out
        say(f"cannot make the mounts private (errno {ctypes.get_errno()}): all left writable")
        return
    for point in _mount_points():
        if point in ("/proc", "/dev") or point.startswith(("/proc/", "/dev/")):
            continue
        if not _mount(libc, point, True, bind=False) and point == "/":
            say(f"cannot make / read-only (errno {ctypes.get_errno()})")
    places = {(p, False) for p in [*writable, "/dev/shm"]}
    places |= {(p, True) for p in [*read_only, *KERNEL_READ_ONLY]}
    for path, ro in sorted(places, key=lambda pr: (pr[0].rstrip("/").count("/"), pr[1])):
        if not _mount(libc, path, ro, bind=True) and ro and os.path.exists(path):
            say(f"cannot make {path} read-only (errno {ctypes.get_errno()})")
    try:  # the current directory was below the new mounts: walk to it through them
        os.chdir(os.getcwd())
    except OSError as e:
        say(f"cannot enter the current directory again: {e}")


def _unmount_under(libc: ctypes.CDLL, folder: str, bound: list[str]) -> None:
    """Detach, in this namespace, the mounts this process made (``bound``) at or below
    ``folder``, the deepest first (``/proc/self`` is the box's now: no mountinfo)."""
    top = folder.rstrip("/")
    for point in sorted(bound, key=lambda p: -p.rstrip("/").count("/")):
        if point.rstrip("/") == top or point.startswith(top + "/"):
            while libc.umount2(point.encode(), MNT_DETACH) == 0:
                pass


def mount_proc(libc: ctypes.CDLL) -> None:
    """A ``/proc`` of this PID namespace (only its processes), its ``sys`` read-only."""
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
    if libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
        _say(f"cannot mount a /proc of its own (errno {ctypes.get_errno()})")
        return
    for path in KERNEL_READ_ONLY:
        _mount(libc, path, True, bind=True)


def _map_user(uid: int, gid: int) -> None:
    maps = (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1"))
    for name, text in maps:
        try:
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        except OSError as e:
            _say(f"cannot write /proc/self/{name}: {e}")


def namespaces(libc: ctypes.CDLL, net: bool) -> int:
    """Enter the namespaces of the module doc (as root directly, else with a user
    namespace); returns the CLONE_ flags entered (0: none)."""
    uid, gid = os.getuid(), os.getgid()
    got = _capabilities(libc)
    privileged = got is not None and any(d.effective for d in got[1])
    user = 0 if privileged else CLONE_NEWUSER
    # a user namespace may mount a /proc only where the host's is not partly hidden
    pid = CLONE_NEWPID if privileged or not remounted("/proc") else 0
    wanted = [CLONE_NEWNS | pid | (CLONE_NEWNET if net else 0), CLONE_NEWNS | pid, CLONE_NEWNS, 0]
    for flags in wanted:
        if (flags | user) and libc.unshare(flags | user) == 0:
            if user:
                _map_user(uid, gid)
            if flags != wanted[0]:
                _say(f"only some namespaces of its own (flags {flags:#x})")
            return flags | user
    _say(f"no namespace of its own (errno {ctypes.get_errno()})")
    return 0


def loopback_up() -> None:
    """Bring ``lo`` up in this new network namespace."""
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, siocgifflags, req))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH14x", b"lo", flags | iff_up))


def _harden_and_exec(libc: ctypes.CDLL, argv: list[str], run: Run | None = None) -> None:
    """Harden this process, then exec PROGRAM; ``run``: call it with PROGRAM's arguments
    in this process instead (a child forked from a server that imported it already:
    :mod:`gatekeeper.worker.server`) and end as a process ends with what it returns
    (``SystemExit``: the interpreter's exit runs what ``atexit`` holds, as a worker's
    own exit would)."""
    drop_capabilities(libc)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _say(f"cannot set no_new_privs (errno {ctypes.get_errno()})")
    sys.stdout.flush()
    sys.stderr.flush()
    if run is not None:
        raise SystemExit(run(argv))
    os.execv(argv[0], argv)


def _exit_as(status: int) -> None:
    """End this process as ``status`` (a wait status) ended its child."""
    if os.WIFSIGNALED(status):
        import resource

        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _init(
    libc: ctypes.CDLL, argv: list[str], alive: int, report: int, new_pid: bool, run: Run | None
) -> None:
    """PID 1 of the box (or, without a PID namespace, the supervisor's one child): die
    with the supervisor, start PROGRAM, reap whatever is orphaned to it, and report
    PROGRAM's wait status; its end kills what is left in the namespace."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if select.select([alive], [], [], 0)[0]:  # the write end closed: the supervisor is gone
        os._exit(1)
    if new_pid:
        mount_proc(libc)
    worker = os.fork()
    if worker == 0:
        for fd in (alive, report):
            os.close(fd)
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        _harden_and_exec(libc, argv, run)

    def forward(sig: int, _frame: object) -> None:
        try:
            os.kill(worker, sig)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    while True:
        pid, status = os.wait()
        if pid == worker:
            os.write(report, status.to_bytes(4, "little"))
            os._exit(0)


def _supervise(child: int, report: int, parent: int, scratch: list[str], bound: list[str]) -> None:
    """Wait for the box's init; pass signals on; end as PROGRAM ended. When the process
    that started this one is gone: kill the box and remove ``scratch``."""
    libc = _libc()

    def on_signal(sig: int, _frame: object) -> None:
        orphaned = os.getppid() != parent
        try:
            os.kill(child, signal.SIGKILL if orphaned else sig)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, on_signal)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if parent and os.getppid() != parent:
        on_signal(signal.SIGTERM, None)
    _, status = os.waitpid(child, 0)
    said = os.read(report, 4)
    if parent and os.getppid() != parent:
        import shutil

        for folder in scratch:
            _unmount_under(libc, folder, bound)  # a mount point is no folder rmtree removes
            shutil.rmtree(folder, ignore_errors=True)
    _exit_as(int.from_bytes(said, "little") if len(said) == 4 else status)


def parse(argv: list[str]) -> tuple[dict, list[str]]:
    opts: dict = {"read_only": [], "writable": [], "parent": 0, "scratch": [], "net": False}
    while argv and argv[0] != "--":
        flag = argv.pop(0)
        if flag == "--private-net":
            opts["net"] = True
        elif flag in ("--read-only", "--writable", "--scratch") and argv:
            opts[flag[2:].replace("-", "_")].append(argv.pop(0))
        elif flag == "--parent" and argv:
            opts["parent"] = int(argv.pop(0))
        else:
            sys.exit(f"confine.py: unknown option {flag}")
    return opts, argv[1:]


def main(argv: list[str], run: Run | None = None) -> None:
    """The box around PROGRAM, this process its supervisor; ``run``: PROGRAM is called
    in the box's worker process rather than exec'd (:func:`_harden_and_exec`)."""
    opts, program = parse(list(argv))
    if not program:
        sys.exit("usage: python -I -S confine.py [OPTION]... -- PROGRAM [ARGS...]")
    libc = _libc()
    flags = namespaces(libc, opts["net"])
    if flags & CLONE_NEWNS:
        filesystem(libc, opts["read_only"], opts["writable"], _say)
    if flags & CLONE_NEWNET:
        try:
            loopback_up()
        except OSError as e:
            _say(f"cannot bring lo up: {e}")
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    alive, alive_w = os.pipe()
    report_r, report = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(alive_w)
        os.close(report_r)
        _init(libc, program, alive, report, bool(flags & CLONE_NEWPID), run)
    os.close(alive)
    os.close(report)
    bound = [*opts["writable"], *opts["read_only"]] if flags & CLONE_NEWNS else []
    _supervise(child, report_r, opts["parent"], opts["scratch"], bound)


if __name__ == "__main__":
    main(sys.argv[1:])
