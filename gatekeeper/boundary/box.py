"""The parent's side of the box (:mod:`gatekeeper.boundary.confine`): start a boxed
process and hear how its box went, the limits the workflow sets, and the runner
owner's choice to run model code unconfined. No torch here.

No box means no run: where the box cannot be made (no user namespace and no
``CAP_SYS_ADMIN``, a masked ``/proc``, a mount the kernel refuses, a system that is not
Linux), :func:`start` raises :class:`~gatekeeper.errors.BoxUnavailable` before any model
code runs: one line naming why and the way out, exit 2. Only the runner's owner may run
model code unconfined instead, outside a pull request's config:
``GATEKEEPER_UNCONFINED=1`` in the workflow's environment, or ``--unconfined``. Then the
box does what the kernel allows, :func:`unconfined` says what it could not, and every
report says ``unconfined`` (docs/hardening.md, "Getting a box").
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import sys
import time
from pathlib import Path

from .. import units
from ..errors import BoxUnavailable, ConfigError
from . import forks
from .forks import Forked

log = logging.getLogger("gatekeeper.box")

UNCONFINED = "GATEKEEPER_UNCONFINED"
MAX_PROCESSES = "GATEKEEPER_MAX_PROCESSES"
MAX_FILE_SIZE = "GATEKEEPER_MAX_FILE_SIZE"
MAX_TIMEOUT = "GATEKEEPER_MAX_TIMEOUT"
DEFAULT_FILE_SIZE = 64 * 2**30
DEFAULT_TIMEOUT = 3600.0
WAY_OUT = (
    "see docs/hardening.md#getting-a-box, or let the runner's owner set "
    f"{UNCONFINED}=1 to run model code unconfined"
)
_SETUP = 300.0  # seconds a box may take to be made (a loaded machine's Python start)

_chosen = False  # --unconfined
_without: list[str] = []  # why a worker of this process ran without its whole box


def choose_unconfined() -> None:
    """``--unconfined``: the runner's owner lets model code run where no box can be made."""
    global _chosen
    _chosen = True


def unconfined_allowed() -> bool:
    return _chosen or os.environ.get(UNCONFINED, "").strip().lower() in ("1", "true", "yes")


def unconfined() -> list[str]:
    """Why a worker of this process ran without its whole box (empty: every box held,
    or no worker ran)."""
    return list(_without)


def _number(name: str, default: int, parse=int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = parse(text)
    except ValueError as e:
        raise ConfigError(f"{name}: {e}") from None
    if value < 1:
        raise ConfigError(f"{name}: {text!r} is not a positive number")
    return value


def max_processes() -> int:
    """``GATEKEEPER_MAX_PROCESSES``: the most processes (and threads) a box holds; by
    default 16384, or a quarter of the machine's ``pid_max`` when that is less."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            most = min(16384, int(f.read()) // 4)
    except (OSError, ValueError):
        most = 16384
    return _number(MAX_PROCESSES, most)


def max_file_size() -> int:
    """``GATEKEEPER_MAX_FILE_SIZE`` (``64GiB`` unset): the largest file a box writes."""
    return _number(MAX_FILE_SIZE, DEFAULT_FILE_SIZE, units.parse_size)


def max_timeout(timeout: float) -> float:
    """``timeout`` (the config's ``measure.timeout``), at most ``GATEKEEPER_MAX_TIMEOUT``
    seconds (3600 unset): the workflow's ceiling, which a pull request's config cannot
    raise."""
    return min(timeout, float(_number(MAX_TIMEOUT, int(DEFAULT_TIMEOUT))))


def confine_flags() -> list[str]:
    """The box's limits, and ``--best-effort`` where the runner's owner chose it."""
    flags = ["--max-processes", str(max_processes()), "--max-file-size", str(max_file_size())]
    return [*flags, "--best-effort"] if unconfined_allowed() else flags


def _without_box(*why: str) -> None:
    """A worker runs without (part of) its box, for these reasons: refused, unless the
    owner chose it (then said once)."""
    if not unconfined_allowed():
        raise BoxUnavailable(f"no box for model code: {'; '.join(why)}; {WAY_OUT}")
    new = [w for w in why if w not in _without]
    if new:
        _without.extend(new)
        log.warning("model code runs unconfined (%s): %s", UNCONFINED, "; ".join(new))


class Boxed:
    """A started box: its process (a ``Popen``, or a
    :class:`~gatekeeper.boundary.forks.Forked` child of a warm server), and what the box
    said of itself."""

    def __init__(self, proc: subprocess.Popen | Forked, status: int | None, said: str = "") -> None:
        self.proc, self._status, self._said = proc, status, said

    @property
    def popen(self) -> subprocess.Popen:
        """The process, started fresh (never forked: ``start(forkable=False)``)."""
        assert isinstance(self.proc, subprocess.Popen)
        return self.proc

    def ended(self) -> str | None:
        """After the process: why the box ended it (a limit), or None."""
        if self._status is not None:
            self._said += _read_all(self._status)
            self.close()
        for line in self._said.splitlines():
            if line.startswith("ended: "):
                return line[len("ended: ") :]
        return None

    def close(self) -> None:
        if self._status is not None:
            os.close(self._status)
            self._status = None


def start(cmd: list[str], forkable: bool = False, isa_check: Path | None = None, **popen) -> Boxed:
    """Start ``cmd`` (:func:`gatekeeper.boundary.spawn.worker_command`) and wait until
    its box is made: raises :class:`BoxUnavailable` (the process reaped) where it was
    refused, and where it is only partly made unless the owner chose to run unconfined.
    ``forkable``: the box and its worker may be a child forked from a warm server
    (:func:`gatekeeper.boundary.forks.fork`: the same box, made by the same code, around
    the same worker's main), where one can start; else a fresh process. ``isa_check``:
    the header worker's ISA check, with which the server checks the CPU's vector
    instructions once before it forks a model's worker (its children inherit the
    answer)."""
    if "--" not in cmd:  # no confine.py: a system without the box
        _without_box(f"no box on {sys.platform} (Linux only)")
        return Boxed(subprocess.Popen(cmd, **popen), None)
    r, w = os.pipe()
    at = cmd.index("--")
    try:
        full = [*cmd[:at], "--status-fd", str(w), *cmd[at:]]
        proc: subprocess.Popen | Forked | None = None
        if forkable:
            proc = forks.fork(full, popen["env"], popen.get("stdout"), w, isa_check)
        if proc is None:
            proc = subprocess.Popen(full, pass_fds=(w,), **popen)
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    boxed = Boxed(proc, r)
    try:
        said, boxed._said = _first_line(r)
    except BaseException:
        proc.kill()
        proc.wait()
        boxed.close()
        raise
    if said == "held":
        return boxed
    if said.startswith("partial: "):
        _without_box(*said[len("partial: ") :].split("; "))
        return boxed
    proc.wait()
    boxed.close()
    if said.startswith("refused: "):
        raise BoxUnavailable(f"no box for model code: {said[len('refused: ') :]}; {WAY_OUT}")
    raise BoxUnavailable(f"the box did not start (exit {proc.returncode})")


def _first_line(fd: int) -> tuple[str, str]:
    """The box's first word on its status pipe ('' if it ended without one), and what
    came after it."""
    got, deadline = b"", time.monotonic() + _SETUP
    while b"\n" not in got:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise BoxUnavailable(f"the box was not made in {_SETUP:.0f} s")
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        got += chunk
    first, _, rest = got.decode(errors="replace").partition("\n")
    return first.strip(), rest


def _read_all(fd: int) -> str:
    os.set_blocking(fd, False)
    got = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            break
        if not chunk:
            break
        got += chunk
    return got.decode(errors="replace")
