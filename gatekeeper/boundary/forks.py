"""Workers forked from a warm server, the parent's side. No torch here.

A fresh worker imports torch, Dynamo and inductor before it does anything (about 5
CPU-seconds); a run of many targets paid that once per target. Here one server per run
and worker environment (:mod:`gatekeeper.worker.server`) imports them once and forks a
child per target, which enters the same box a fresh worker's ``confine.py`` builds
before any model code runs, then runs the worker's ``main``. A child is waited for,
timed out and killed as a process is (:class:`Forked` has the part of ``Popen`` the
callers use); a crash ends the child alone.

Fresh processes stay where a fork would change what is measured or cannot be clean: a
probe (it times a first call in a new process, imports included), a target on a GPU
(a process that forks must not have initialised CUDA, and the check cannot be made
without initialising it), a distributed target's ranks (their launcher starts them), and
everywhere when ``GATEKEEPER_FORKS=off``. docs/hardening.md, "Forked workers".
"""

from __future__ import annotations

import array
import atexit
import contextlib
import hashlib
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("gatekeeper.forks")

# what each child sets for itself; the rest of its environment is its server's
PER_CHILD = frozenset({"TMPDIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_HOME"})
_READY_TIMEOUT = 300.0
MAX_FDS = 4  # descriptors one message may carry


def env_digest(env: Mapping[str, str]) -> str:
    """What a server's children inherit of it, as a digest: a child is forked only from
    a server whose environment is the one its fresh worker would have had, less
    :data:`PER_CHILD` (torch reads much of it when imported), and whose process limits,
    CPUs and priority are this process's (a fresh worker inherits them: a ``ulimit -v``
    or ``taskset`` around gatekeeper holds for its workers, forked or not)."""
    kept = sorted((k, v) for k, v in env.items() if k not in PER_CHILD)
    return hashlib.sha256(json.dumps([kept, _inherited()]).encode()).hexdigest()


def _inherited() -> list:
    """This process's limits, CPUs and priority: what a child inherits besides its
    environment."""
    import resource

    names = ("AS", "DATA", "FSIZE", "NOFILE", "NPROC", "STACK", "CORE", "MEMLOCK", "RSS")
    limits = [
        resource.getrlimit(getattr(resource, f"RLIMIT_{n}"))
        for n in names
        if hasattr(resource, f"RLIMIT_{n}")
    ]
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return [limits, cpus, os.getpriority(os.PRIO_PROCESS, 0)]


def enabled() -> bool:
    return sys.platform == "linux" and os.environ.get("GATEKEEPER_FORKS", "").lower() not in (
        "off",
        "0",
    )


class Forked:
    """A forked child as its caller sees it: ``wait``, ``kill``, ``returncode``."""

    def __init__(self, channel: socket.socket, pid: int) -> None:
        self.channel, self.pid = channel, pid
        self.returncode: int | None = None
        self._buffer = b""

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0)
            ready, _, _ = select.select([self.channel], [], [], left)
            if not ready:
                continue
            data = self.channel.recv(4096)
            if not data:  # the server is gone: so is the child (it dies with it)
                self.returncode = -signal.SIGKILL
                break
            self._buffer += data
            if b"\n" in self._buffer:
                status = json.loads(self._buffer.split(b"\n", 1)[0])["status"]
                self.returncode = os.waitstatus_to_exitcode(status)
        self.channel.close()
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


class Server:
    """One :mod:`gatekeeper.worker.server`: started by this process with ``env`` (a
    worker's, less :data:`PER_CHILD`), its socket this process's alone; or a test
    session's, connected to (:func:`connect`)."""

    def __init__(self, sock: socket.socket, proc: subprocess.Popen | None, home: Path | None):
        self.sock, self.proc, self.home = sock, proc, home
        self.lock = threading.Lock()

    @classmethod
    def start(cls, env: Mapping[str, str]) -> Server:
        home = Path(tempfile.mkdtemp(prefix="gk-server-"))
        ours, theirs = socket.socketpair()
        server_env = dict(env) | {"TMPDIR": str(home), "TORCHINDUCTOR_CACHE_DIR": str(home / "c")}
        with open(home / "server.log", "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gatekeeper.worker.server", str(theirs.fileno())],
                env=server_env,
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=home,
            )
        theirs.close()
        server = cls(ours, proc, home)
        first = receive(ours, _READY_TIMEOUT)
        if first is None or "ready" not in first[0]:
            said = first[0].get("refused") if first else server._log_tail()
            server.close()
            raise OSError(f"the worker server did not start: {said}")
        return server

    @classmethod
    def connect(cls, spec: str) -> tuple[Server, str]:
        """The shared server ``spec`` names (``PATH#TOKEN``), and its environment's
        digest."""
        path, _, token = spec.partition("#")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        sock.sendall(json.dumps({"token": token}).encode() + b"\n")
        first = receive(sock, _READY_TIMEOUT)
        if first is None or "ready" not in first[0]:
            sock.close()
            raise OSError(f"the shared worker server {path} refused this process")
        return cls(sock, None, None), str(first[0].get("env"))

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError, TypeError):
            text = (self.home / "server.log").read_text(errors="replace")  # type: ignore[operator]
            return (text.strip().splitlines() or ["no output"])[-1]
        return "no output"

    def fork(
        self,
        argv: list[str],
        env: Mapping[str, str],
        cwd: str,
        fds: list[int],
        box: list[str],
        isa_check: Path | None = None,
    ) -> Forked:
        """Fork ``argv`` in ``box``; ``fds``: its log and the box's status pipe;
        ``isa_check``: the ISA check the server checks the CPU with first, once."""
        doc = {"argv": argv, "env": dict(env), "cwd": cwd, "box": box}
        if isa_check is not None:
            doc["isa_check"] = str(isa_check)
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        with self.lock:
            self.sock.sendmsg([json.dumps(doc).encode()], anc)
            got = receive(self.sock, _READY_TIMEOUT)
        if got is None or not got[1]:
            raise OSError(f"the worker server forked nothing: {got[0] if got else 'no answer'}")
        channel = socket.socket(fileno=got[1][0])
        pid = receive(channel, _READY_TIMEOUT)
        if pid is None:
            channel.close()
            raise OSError("the forked worker never started")
        return Forked(channel, int(pid[0]["pid"]))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)


def receive(sock: socket.socket, timeout: float | None = None) -> tuple[dict, list[int]] | None:
    """One JSON line and the descriptors it carries (at most :data:`MAX_FDS`); None when
    the other end hung up, or nothing came in ``timeout`` seconds. Both sides' reader:
    the parent's and the worker server's."""
    if timeout is not None and not select.select([sock], [], [], timeout)[0]:
        return None
    fds = array.array("i")
    data, anc, _, _ = sock.recvmsg(1 << 20, socket.CMSG_LEN(MAX_FDS * fds.itemsize))
    if not data:
        return None
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return json.loads(data.split(b"\n", 1)[0]), list(fds)


_servers: dict[str, Server | None] = {}  # None: it could not start; fresh workers


# GATEKEEPER_FORK_SERVER's (``PATH#TOKEN``, comma-separated: one per environment), once
# connected
_shared: list[tuple[Server, str]] = []


def _server(env: Mapping[str, str]) -> Server | None:
    """The server for ``env``: the test session's shared one whose environment is this
    one, else this run's own, started on first use."""
    digest = env_digest(env)
    if digest in _servers:
        return _servers[digest]
    specs = [s for s in os.environ.get("GATEKEEPER_FORK_SERVER", "").split(",") if s]
    if specs and not _shared:
        for spec in specs:
            with contextlib.suppress(OSError):
                _shared.append(Server.connect(spec))
    for server, its in _shared:
        if its == digest:
            _servers[digest] = server
            return server
    try:
        _servers[digest] = Server.start({k: v for k, v in env.items() if k not in PER_CHILD})
    except OSError as e:
        log.warning("%s: each worker starts a fresh process", e)
        _servers[digest] = None
    return _servers[digest]


@atexit.register
def close_all() -> None:
    for server in {id(s): s for s in _servers.values() if s is not None}.values():
        server.close()
    for server, _ in _shared:
        server.close()
    _servers.clear()
    _shared.clear()


def fork(
    cmd: list[str],
    env: Mapping[str, str],
    log_file,
    status_fd: int,
    isa_check: Path | None = None,
) -> Forked | None:
    """The boxed worker ``cmd`` (``confine.py OPTIONS -- PROGRAM``, its ``--status-fd``
    ``status_fd``) forked from its environment's server, or None where there is none
    (``GATEKEEPER_FORKS=off``, a server that could not start): then the caller starts a
    fresh process. ``log_file``: its output (None: this process's own stderr);
    ``isa_check``: :meth:`Server.fork`'s."""
    if not enabled() or "--" not in cmd or not cmd[3].endswith("confine.py"):
        return None
    split = cmd.index("--")  # python -I -S confine.py BOX... -- PROGRAM
    box, program = cmd[4:split], cmd[split + 1 :]
    # the box's --parent is the server in the child; its --status-fd the descriptor sent
    box = ["{server}" if i and box[i - 1] == "--parent" else a for i, a in enumerate(box)]
    box = ["{status}" if i and box[i - 1] == "--status-fd" else a for i, a in enumerate(box)]
    server = _server(env)
    if server is None:
        return None
    try:
        out = log_file.fileno() if log_file is not None else sys.stderr.fileno()
        return server.fork(program, env, os.getcwd(), [out, status_fd], box, isa_check)
    except OSError as e:
        log.warning("%s: this worker starts a fresh process", e)
        return None
