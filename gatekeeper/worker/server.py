"""``python -m gatekeeper.worker.server FD``: a worker server. It imports torch, Dynamo,
inductor and the worker's modules once, runs no model code, and forks a child per
request; the child enters the same box a fresh worker's ``confine.py`` builds, then runs
the worker's ``main`` (or the header worker's, :mod:`gatekeeper.worker.headers`) in that
box instead of exec'ing a new interpreter (which would import torch again: about 5
CPU-seconds a worker). docs/hardening.md, "Forked workers".

It talks to one parent only, over the socket FD the parent handed it (no path a box could
reach): each request, a JSON line with the child's arguments, environment, working
directory and box options and, as ancillary data, the log's descriptor, is answered with
a new socket (one end of a fresh pair, as ancillary data) on which the child's supervisor
pid and then its wait status arrive. It forks only while it is one thread with CUDA
uninitialised, dies with its parent, and never reads what a child says.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import hmac
import json
import os
import select
import shutil
import signal
import socket
import struct
import sys
import threading
from pathlib import Path
from typing import Any

from ..boundary.forks import env_digest, receive
from .imports import preload
from .procmaps import PAGE, PAGEMAP, file_mappings, file_page, page_entries, present

PR_SET_PDEATHSIG = 1
SO_PEERCRED = 17


MADV_POPULATE_READ = 22  # Linux 5.14
# the file pages (libraries, bytecode) this server's imports mapped: (address, length)
_resident: list[tuple[int, int]] = []


def resident_file_pages() -> list[tuple[int, int]]:
    """The runs of file-backed pages mapped in this process (``/proc/self/pagemap``'s
    present and file bits, readable mappings): the library code and data its imports
    touched. A fork copies the page tables of anonymous memory only, so a child starts
    without these mapped though they are resident in the server."""
    runs: list[tuple[int, int]] = []
    with open(PAGEMAP, "rb") as pagemap:
        for m in file_mappings():
            if "r" not in m.perms:
                continue
            start = None
            for i, e in enumerate([*page_entries(m.lo, m.hi, pagemap), 0]):
                mapped = present(e) and file_page(e)
                if mapped and start is None:
                    start = i
                elif not mapped and start is not None:
                    runs.append((m.lo + start * PAGE, (i - start) * PAGE))
                    start = None
    return runs


def map_again(runs: list[tuple[int, int]]) -> None:
    """Map ``runs`` (:func:`resident_file_pages` of the server) in this forked child,
    as a fresh worker's own imports mapped them: its resident set, and so its peak
    (:func:`gatekeeper.worker.memory.process_peak`), then counts the same library pages
    a fresh worker's counts (about 80 MB of torch's, a few milliseconds: the pages are in
    the page cache). Where the kernel has no ``MADV_POPULATE_READ``, a byte of each page
    is read."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for address, length in runs:
        if libc.madvise(address, length, MADV_POPULATE_READ) != 0:
            for at in range(address, address + length, PAGE):
                ctypes.string_at(at, 1)


def forkable() -> str | None:
    """Why a fork now would not be a clean worker (None: it would)."""
    if threading.active_count() > 1:
        return f"{threading.active_count()} Python threads"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised"
    return None


def _answer(sock: socket.socket, doc: dict[str, Any], fds: list[int] = ()) -> None:  # type: ignore[assignment]
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([json.dumps(doc).encode() + b"\n"], anc)


def child(req: dict[str, Any], log: int, status: int, channel: socket.socket) -> None:
    """In the forked child: the request's environment, working directory and log, then
    the box (``confine.enter``, this process its supervisor, ``status`` the pipe it says
    ``held`` or ``refused`` on) around the worker's main, called in the box's worker
    process (``confine.run``). Never returns: the worker ends by
    :func:`gatekeeper.worker.end` (its threads joined and ``atexit`` functions run, as a
    fresh worker's end runs them); the box's other processes end by ``os._exit``."""
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        _this_processes_temp_dir()
        channel.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
        channel.close()
        from ..boundary import confine

        # the box's --parent is the process this one must die with: the server
        fill = {"{server}": str(os.getppid()), "{status}": str(status)}
        opts, program = confine.parse([*(fill.get(a, a) for a in req["box"]), "--", *req["argv"]])
        try:
            box = confine.enter(opts)
        except confine.Refused as e:
            confine._refuse(confine.Box(opts), str(e))
        confine.run(box, lambda: _run(program))
    except SystemExit:
        raise  # an exit before the worker's main (a bad box option): as an interpreter exits
    except BaseException as e:  # never back into the server's loop
        os.write(2, f"gatekeeper worker server: the child failed: {e!r}\n".encode())
    os._exit(70)


def _this_processes_temp_dir() -> None:
    """What torch read of the temp dir when the server imported it, read again for this
    child's (its ``TMPDIR``): where inductor keeps its precompiled headers."""
    import tempfile

    tempfile.tempdir = None
    from torch._inductor import codecache
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from . import headers

    if hasattr(codecache, "_HEADER_DIR"):
        headers.use_folder(os.path.join(default_cache_dir(), "precompiled_headers"))


def _run(argv: list[str]) -> None:
    from . import end

    map_again(_resident)  # in the box's worker process, whose peak is read
    end(_main(argv))


def _main(argv: list[str]) -> int:
    """The program's main, in the box's worker process (argv: PROGRAM's, ``python -m
    MODULE ARGS``): the worker's (whose last two are the request and response paths) or
    the header worker's (which runs no model code: :mod:`gatekeeper.worker.headers`),
    the only two a server forks."""
    import faulthandler

    if argv[1:3] == ["-m", "gatekeeper.worker.headers"]:
        from . import headers

        module, main, args = "gatekeeper.worker.headers", headers.main, argv[3:]
    else:
        from . import __main__ as worker

        module, main, args = "gatekeeper.worker", worker.main, argv[-2:]
    faulthandler.enable(all_threads=False)
    sys.argv = [module, *args]
    try:
        code = main(args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


_isa_tried = False


def _check_isa(isa: str) -> None:
    """Inductor's check of the CPU's vector instructions, tried once, before forking a
    model's worker (:func:`gatekeeper.worker.imports.check_isa`: each child inherits
    the answer instead of loading six libraries in six new processes, about 1 s a
    worker): with the header worker's ISA check ``isa`` lent into this server's cache
    dir, as the parent lends it to a worker's. Where it fails, each child checks."""
    global _isa_tried
    if _isa_tried:
        return
    _isa_tried = True
    from ..boundary.headers import lend_isa_check
    from .imports import check_isa

    try:
        lend_isa_check(Path(isa), Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]))
        check_isa()
    except Exception as e:  # never the server's end: its children check for themselves
        os.write(2, f"gatekeeper worker server: no ISA check ahead: {e!r}\n".encode())


class _Child:
    """A forked child: its client, the channel its end is reported on, its scratch."""

    def __init__(self, client: socket.socket, channel: socket.socket, scratch: list[str]):
        self.client, self.channel, self.scratch = client, channel, scratch


class Server:
    """The loop: clients (the one parent of a run, or each gatekeeper process of a test
    session that connected with the token), their fork requests, the children's ends."""

    def __init__(self, listener: socket.socket | None, token: str | None) -> None:
        self.listener, self.token = listener, token
        self.clients: list[socket.socket] = []
        self.children: dict[int, _Child] = {}
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def serve(self) -> None:
        """Until the last client hangs up (a listening server: until it is killed)."""
        while self.clients or self.listener is not None:
            fds = [c.fileno() for c in self.clients] + [self.wake_r]
            fds += [self.listener.fileno()] if self.listener is not None else []
            ready, _, _ = select.select(fds, [], [])
            if self.wake_r in ready:
                os.read(self.wake_r, 512)
                self._reap()
            if self.listener is not None and self.listener.fileno() in ready:
                self._accept()
            for client in [c for c in self.clients if c.fileno() in ready]:
                self._request(client)

    def _accept(self) -> None:
        """A client of a listening server: the same user, outside every box (its PID
        and mount namespaces are the server's), and it knows the token."""
        assert self.listener is not None
        conn, _ = self.listener.accept()
        try:
            pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, SO_PEERCRED, 12))
            outside = all(
                os.readlink(f"/proc/{pid}/ns/{ns}") == os.readlink(f"/proc/self/ns/{ns}")
                for ns in ("pid", "mnt", "user")
            )
            ready, _, _ = select.select([conn], [], [], 10)
            hello = json.loads(conn.recv(4096).split(b"\n", 1)[0]) if ready else {}
            token = str(hello.get("token", ""))
            if (
                uid != os.getuid()
                or not outside
                or not hmac.compare_digest(token, self.token or "x")
            ):
                raise PermissionError("refused")
            _answer(conn, {"ready": os.getpid(), "env": env_digest(os.environ)})
            self.clients.append(conn)
        except (OSError, ValueError, PermissionError):
            conn.close()

    def _request(self, client: socket.socket) -> None:
        got = receive(client)
        if got is None:  # the client is gone: so are its children, and their scratch
            self._drop(client)
            return
        req, fds = got
        if req.get("isa_check"):
            _check_isa(req["isa_check"])
        why = forkable()
        if why is not None or len(fds) != 2:
            _answer(client, {"refused": why or "a log and a status descriptor expected"})
            for fd in fds:
                os.close(fd)
            return
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:  # its supervisor writes its pid on ``ours``, the parent reads ``theirs``
            signal.set_wakeup_fd(-1)
            for fd in (self.wake_r, self.wake_w):  # nothing of the server's stays open
                os.close(fd)
            for other in [*self.clients, *(c.channel for c in self.children.values())]:
                other.close()
            if self.listener is not None:
                self.listener.close()
            theirs.close()
            child(req, fds[0], fds[1], ours)
        for fd in fds:
            os.close(fd)
        _answer(client, {"forked": True}, [theirs.fileno()])
        theirs.close()
        scratch = [b for a, b in zip(req["box"], req["box"][1:], strict=False) if a == "--scratch"]
        self.children[pid] = _Child(client, ours, scratch)

    def _drop(self, client: socket.socket) -> None:
        """A client hung up with children still running (it was killed): end each box
        (its init dies with its supervisor) and remove its scratch, as a fresh worker's
        supervisor does when gatekeeper dies."""
        self.clients.remove(client)
        client.close()
        for pid, c in list(self.children.items()):
            if c.client is client:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
                self.children.pop(pid).channel.close()
                for folder in c.scratch:
                    shutil.rmtree(folder, ignore_errors=True)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if (c := self.children.pop(pid, None)) is not None:
                with contextlib.suppress(OSError):
                    c.channel.sendall(json.dumps({"status": status}).encode() + b"\n")
                c.channel.close()


def main(argv: list[str]) -> int:
    """``FD``: serve the parent that handed this process that socket, until it hangs up;
    ``--listen PATH``: serve every client that connects to PATH with the token read from
    standard input (a test session's shared server), until killed. Either way it dies
    with the process that started it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    listener, token, first = None, None, None
    if argv[:1] == ["--listen"]:
        token = sys.stdin.readline().strip()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(argv[1])
        listener.listen(16)
    else:
        first = socket.socket(fileno=int(argv[0]))
    from . import __main__  # noqa: F401  (the worker's main, run in each child)

    # what every worker imports ahead, then frozen (gc.freeze: a child's collections
    # would write to each object of the imports and copy the server's pages into it)
    preload()
    _resident[:] = resident_file_pages()
    if (why := forkable()) is not None:
        if first is not None:
            _answer(first, {"refused": why})
        return 1
    server = Server(listener, token)
    if first is not None:
        _answer(first, {"ready": os.getpid(), "env": env_digest(os.environ)})
        server.clients.append(first)
    else:
        print(f"ready {os.getpid()}", flush=True)
    server.serve()
    return 0


if __name__ == "__main__":
    from . import end

    end(main(sys.argv[1:]))
