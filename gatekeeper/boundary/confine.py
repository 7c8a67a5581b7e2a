"""What a worker starts as on Linux: ``python -I -S confine.py [OPTION]... -- PROGRAM
ARGS...`` puts PROGRAM (the worker, or a distributed target's launcher) in a box before
any code of the model or of its site-packages runs, and stays outside it as its
supervisor. Standard library only, run without ``site``.

The box (:func:`enter`, then :func:`run`): its own mount and PID namespaces, through a
user namespace of its own unless this process holds ``CAP_SYS_ADMIN`` (root without it,
a container's default, tries one first; ``--private-net``: a network namespace with
only ``lo``); the filesystem read-only, ``nodev`` and ``nosuid`` but the ``--writable``
folders, each ``--read-only`` folder read-only again inside them (the deeper folder
decides); a fresh minimal ``/dev`` (:mod:`confine_mounts`) with a ``/dev/shm`` of its own
and only the ``--device`` nodes besides; a ``/proc`` of its own; PROGRAM under an init of
its own, so no process outlives the box, and no more than ``--max-processes`` in it;
every capability dropped, ``no_new_privs``, no file over ``--max-file-size``.

It fails closed: a step the kernel refuses ends it before PROGRAM runs, saying why on
stderr and, as ``refused: <why>``, on ``--status-fd``; ``--best-effort`` (the runner
owner's ``GATEKEEPER_UNCONFINED``) skips such a step and says ``partial: <why>`` there
instead. ``held`` there means every step took. The init writes ``ended: <why>`` when it
ended the box for a limit. What each step keeps out, and why not bubblewrap:
docs/hardening.md.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
from collections.abc import Callable

if __package__:
    from . import confine_mounts as mounts
else:  # run by its path (python -I -S confine.py): its own folder, after the library's
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
    import confine_mounts as mounts  # type: ignore[import-not-found,no-redef]

PR_SET_PDEATHSIG = 1
PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_GET_NO_NEW_PRIVS = 39
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CAP_VERSION_3 = 0x20080522
CAP_SYS_ADMIN = 21
REFUSED = 125  # the exit code of a box that could not be made (nothing ran)
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
POLL = 0.02  # seconds between the init's looks at the process count


class Refused(Exception):
    """A step of the box the kernel refused (``str``: why, one line)."""


class Options:
    """What the box is made of: :func:`parse` reads it from the command line; a process
    forked from a warm server would make one itself and call :func:`enter`, then
    :func:`run`."""

    def __init__(self, **given: object) -> None:
        self.read_only: list[str] = []
        self.writable: list[str] = []
        self.devices: list[str] = []  # device nodes bound into the box's /dev (a GPU's)
        self.scratch: list[str] = []  # removed if ``parent`` dies first
        self.parent = 0
        self.net = False
        self.status_fd = -1
        self.max_processes = 0  # 0: no limit
        self.max_file_size = 0  # bytes; 0: no limit
        self.best_effort = False
        for name, value in given.items():
            if not hasattr(self, name):
                raise TypeError(f"unknown option {name}")
            setattr(self, name, value)


class Box:
    """What :func:`enter` made: the namespaces entered, the steps skipped (best
    effort), and the pids cgroup that limits it (None: none writable)."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.flags = 0
        self.missing: list[str] = []
        self.cgroup: mounts.Cgroup | None = None
        # each scratch folder's parent, opened before the filesystem became read-only
        # (the host's mounts: the supervisor removes them through it), and its name
        self.scratch: list[tuple[int, str]] = []

    def close_outside(self) -> None:
        """In the box's init: nothing that reaches outside the box stays open (the
        cgroup above it, the scratch folders' parents on the host's writable mounts)."""
        if self.cgroup is not None:
            self.cgroup.close()
        for fd, _ in self.scratch:
            os.close(fd)

    def step(self, ok: bool, why: str) -> bool:
        """A step's outcome: refused ends the box unless best effort (then it is said)."""
        if not ok:
            if not self.opts.best_effort:
                raise Refused(why)
            self.missing.append(why)
            _say(why)
        return ok

    def status(self, text: str) -> None:
        if self.opts.status_fd >= 0:
            try:
                os.write(self.opts.status_fd, f"{text}\n".encode(errors="replace"))
            except OSError:
                pass


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
    return libc


def _say(what: str) -> None:
    sys.stderr.write(f"gatekeeper box: {what}\n")


def _errno(what: str) -> str:
    err = ctypes.get_errno()
    return f"{what}: {os.strerror(err)}" if err else what


def _capabilities(libc: ctypes.CDLL) -> tuple[_Header, ctypes.Array] | None:
    header, data = _Header(CAP_VERSION_3, 0), (_Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        return None
    return header, data


def _has(data: ctypes.Array, cap: int) -> bool:
    word, bit = divmod(cap, 32)
    return bool(data[word].effective & (1 << bit))


def drop_capabilities(libc: ctypes.CDLL) -> str | None:
    """Every capability out of every set, the bounding set included (no exec gives one
    back, root's included); why it could not be, or None."""
    held = _capabilities(libc)
    if held is None:
        return _errno("cannot read its capabilities")
    cap = 0
    while libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0:  # up to the kernel's last
        if libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0) and libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0):
            if os.geteuid() == 0:  # for another user, no_new_privs keeps exec from it
                return _errno(f"cannot drop capability {cap} from the bounding set")
        cap += 1
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header, data = held
    header.version, header.pid = CAP_VERSION_3, 0
    for word in data:
        word.effective = word.permitted = word.inheritable = 0
    if libc.capset(ctypes.byref(header), data) != 0:
        return _errno("cannot drop its capabilities")
    left = _capabilities(libc)
    if left is None or any(d.effective or d.permitted or d.inheritable for d in left[1]):
        return "capabilities left after dropping them all"
    return None


def _map_user(uid: int, gid: int) -> str | None:
    maps = (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1"))
    for name, text in maps:
        try:
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        except OSError as e:
            return f"cannot write /proc/self/{name}: {e.strerror}"
    return None


def _no_user_namespace(err: int) -> str:
    """Why ``unshare(CLONE_NEWUSER)`` failed, in the words of its usual causes."""
    try:
        with open("/proc/sys/user/max_user_namespaces") as f:
            if f.read().strip() == "0":
                return "no user namespace for this user (user.max_user_namespaces is 0)"
    except OSError:
        pass
    return f"no user namespace for this user ({os.strerror(err)}: a seccomp profile, or a limit)"


def namespaces(libc: ctypes.CDLL, box: Box) -> None:
    """Enter the namespaces of the module doc: directly with ``CAP_SYS_ADMIN``, else
    through a user namespace of its own (its uid and gid mapped to themselves)."""
    uid, gid = os.getuid(), os.getgid()
    held = _capabilities(libc)
    admin = held is not None and _has(held[1], CAP_SYS_ADMIN)
    user = 0 if admin else CLONE_NEWUSER
    wanted = CLONE_NEWNS | CLONE_NEWPID | (CLONE_NEWNET if box.opts.net else 0)
    if libc.unshare(wanted | user) == 0:
        box.flags = wanted | user
    else:
        err = ctypes.get_errno()
        why = _no_user_namespace(err) if user else f"cannot unshare: {os.strerror(err)}"
        if not admin and os.getuid() == 0:
            why = f"root without CAP_SYS_ADMIN and {why}"
        box.step(False, why)
        for fewer in (CLONE_NEWNS | CLONE_NEWPID, CLONE_NEWNS):  # best effort: what it can
            if libc.unshare(fewer | user) == 0:
                box.flags = fewer | user
                break
    if box.flags & CLONE_NEWUSER:
        mapped = _map_user(uid, gid)
        box.step(mapped is None, str(mapped))


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


def enter(opts: Options, libc: ctypes.CDLL | None = None) -> Box:
    """Make this process the box's supervisor: its pids cgroup, namespaces, filesystem,
    ``/dev`` and network. Raises :class:`Refused` where a step cannot be done (unless
    ``opts.best_effort``). The box's processes are this one's children: :func:`run`."""
    libc = libc or _libc()
    box = Box(opts)
    if opts.max_processes:
        box.cgroup = mounts.pids_cgroup(opts.max_processes)
    for folder in opts.scratch:
        try:
            parent = os.open(os.path.dirname(folder), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        box.scratch.append((parent, os.path.basename(folder)))
    namespaces(libc, box)
    if box.flags & CLONE_NEWNS:
        mounts.filesystem(libc, box)
    else:
        box.step(False, "no mount namespace: the filesystem stays writable")
    if box.flags & CLONE_NEWNET:
        try:
            loopback_up()
        except OSError as e:
            box.step(False, f"cannot bring lo up: {e.strerror}")
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    elif opts.net:
        box.step(False, "no network namespace of its own")
    return box


def _harden(libc: ctypes.CDLL, box: Box) -> None:
    """The worker's last steps before PROGRAM: no capability, ``no_new_privs``, the
    limits; then ``held`` (or ``partial: ...``) on the status fd."""
    import resource

    box.step((why := drop_capabilities(libc)) is None, str(why))
    ok = libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
    box.step(ok and libc.prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1, _errno("no no_new_privs"))
    limits = [(resource.RLIMIT_FSIZE, box.opts.max_file_size)]
    most = box.opts.max_processes
    if os.getuid() != 0 and most:  # never enforced for root: the cgroup or the init's count
        # is; in the box's user namespace it counts the box and its supervisor, so the
        # init's count sees the limit reached (and ends the box) when a fork is refused
        limits.append((resource.RLIMIT_NPROC, most + 2))
    for which, most in limits:
        if most:
            hard = resource.getrlimit(which)[1]
            most = most if hard == resource.RLIM_INFINITY else min(most, hard)
            try:
                resource.setrlimit(which, (most, most))
            except (OSError, ValueError) as e:
                box.step(False, f"cannot set a limit ({which}): {e}")
    box.status("partial: " + "; ".join(box.missing) if box.missing else "held")


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


def _refuse(box: Box, why: str) -> None:
    _say(f"refused: {why}")
    box.status(f"refused: {why}")
    os._exit(REFUSED)


class _Watch:
    """The init's look at the box's size: a fork the pids cgroup refused (its
    ``pids.events``), or, without one, more processes in the box's own ``/proc`` than
    the limit. Either ends the box."""

    def __init__(self, box: Box) -> None:
        self.most = box.opts.max_processes
        self.events = mounts.open_events(box.cgroup)
        self.count = bool(self.most) and bool(box.flags & CLONE_NEWPID) and self.events is None

    def over(self) -> bool:
        if self.events is not None:
            return mounts.refused_forks(self.events) > 0
        if self.count:
            return sum(1 for n in os.listdir("/proc") if n.isdigit()) > self.most
        return False


def _init(libc: ctypes.CDLL, box: Box, program: Callable[[], None], alive: int, report: int):
    """PID 1 of the box (or, without a PID namespace, the supervisor's one child): die
    with the supervisor, start PROGRAM, reap whatever is orphaned to it, end the box at
    its process limit, and report PROGRAM's wait status; its end kills what is left in
    the namespace."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if select.select([alive], [], [], 0)[0]:  # the write end closed: the supervisor is gone
        os._exit(1)
    box.close_outside()
    try:
        if box.flags & CLONE_NEWPID:
            mounts.mount_proc(libc, box)
        else:
            box.step(False, "no PID namespace: the worker sees every process")
    except Refused as e:
        _refuse(box, str(e))
    watch = _Watch(box)
    worker = os.fork()
    if worker == 0:
        for fd in (alive, report, watch.events):
            if fd is not None:
                os.close(fd)
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        try:
            _harden(libc, box)
        except Refused as e:
            _refuse(box, str(e))
        if box.opts.status_fd >= 0:
            os.close(box.opts.status_fd)
        sys.stdout.flush()
        sys.stderr.flush()
        program()
        os._exit(127)

    def forward(sig: int, _frame: object) -> None:
        try:
            os.kill(worker, sig)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    wake, wake_w = os.pipe()  # a signal (SIGCHLD above all) wakes the select below
    for fd in (wake, wake_w):
        os.set_blocking(fd, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    while True:
        try:
            while (found := os.waitpid(-1, os.WNOHANG))[0]:
                if found[0] == worker:
                    os.write(report, found[1].to_bytes(4, "little"))
                    os._exit(0)
        except ChildProcessError:
            os._exit(1)
        if watch.over():
            box.status(f"ended: more than {watch.most} processes (GATEKEEPER_MAX_PROCESSES)")
            os.kill(-1 if box.flags & CLONE_NEWPID else worker, signal.SIGKILL)
            os.write(report, int(signal.SIGKILL).to_bytes(4, "little"))
            os._exit(0)
        if alive in select.select([alive, wake], [], [], POLL if watch.most else None)[0]:
            os._exit(1)  # the supervisor is gone (PR_SET_PDEATHSIG is on its way)
        try:
            os.read(wake, 512)
        except BlockingIOError:
            pass


def _supervise(child: int, report: int, box: Box) -> None:
    """Wait for the box's init; pass signals on; end as PROGRAM ended. When the process
    that started this one is gone: kill the box and remove the scratch folders."""
    libc, parent = _libc(), box.opts.parent

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
    if box.cgroup is not None:
        box.cgroup.leave()
    if parent and os.getppid() != parent:
        import shutil

        mounts.release(libc, [*box.opts.writable, *box.opts.read_only], box.opts.scratch)
        for fd, name in box.scratch:  # through the host's mounts: the box's are read-only
            shutil.rmtree(name, ignore_errors=True, dir_fd=fd)
    _exit_as(int.from_bytes(said, "little") if len(said) == 4 else status)


def run(box: Box, program: Callable[[], None], libc: ctypes.CDLL | None = None) -> None:
    """Start the box's init (which runs ``program`` in the worker, its last steps done:
    :func:`_harden`) and supervise it; never returns."""
    libc = libc or _libc()
    alive, alive_w = os.pipe()
    report_r, report = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(alive_w)
        os.close(report_r)
        _init(libc, box, program, alive, report)
    os.close(alive)
    os.close(report)
    if box.opts.status_fd >= 0:
        os.close(box.opts.status_fd)  # the box's own say, from now on
    _supervise(child, report_r, box)


_LISTS = {"--read-only": "read_only", "--writable": "writable", "--scratch": "scratch"}
_LISTS |= {"--device": "devices"}
_NUMBERS = {"--parent": "parent", "--status-fd": "status_fd", "--max-processes": "max_processes"}
_NUMBERS |= {"--max-file-size": "max_file_size"}


def parse(argv: list[str]) -> tuple[Options, list[str]]:
    opts = Options()
    while argv and argv[0] != "--":
        flag = argv.pop(0)
        if flag == "--private-net":
            opts.net = True
        elif flag == "--best-effort":
            opts.best_effort = True
        elif flag in _LISTS and argv:
            getattr(opts, _LISTS[flag]).append(argv.pop(0))
        elif flag in _NUMBERS and argv:
            setattr(opts, _NUMBERS[flag], int(argv.pop(0)))
        else:
            sys.exit(f"confine.py: unknown option {flag}")
    return opts, argv[1:]


def main(argv: list[str]) -> None:
    opts, program = parse(list(argv))
    if not program:
        sys.exit("usage: python -I -S confine.py [OPTION]... -- PROGRAM [ARGS...]")
    libc = _libc()
    try:
        box = enter(opts, libc)
    except Refused as e:
        _refuse(Box(opts), str(e))
    run(box, lambda: os.execv(program[0], program), libc)


if __name__ == "__main__":
    main(sys.argv[1:])
