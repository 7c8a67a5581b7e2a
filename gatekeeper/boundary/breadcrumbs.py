"""Where the worker is, for the parent to read when the worker dies without answering.

The worker records each step it enters (``build model``, ``export``,
``aoti_compile_and_package``, ``load package``, ``first call``, ``measure``...) in a small
JSON file beside its response (``<response>.step``, replaced atomically, with torch's
version once torch is imported). A worker killed by a signal (SIGSEGV in torch's C++ or
the model's native code, SIGABRT from a failed C++ check, SIGKILL from the OOM killer)
leaves that file behind, and :func:`describe` turns the death into one line: the signal,
the step, and the model's own line where Python's faulthandler (enabled in the worker)
wrote the crashing thread's stack into the worker's log.

No torch here: the parent (:mod:`gatekeeper.boundary.client`) imports this module.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import safefs

SUFFIX = ".step"

_path: Path | None = None
_current: str | None = None


def current() -> str | None:
    """The step this process entered last (None before the first)."""
    return _current


def breadcrumb(response: Path) -> Path:
    """The step file of the worker that answers in ``response``."""
    return response.with_name(response.name + SUFFIX)


def begin(response: Path) -> None:
    """Record this worker's steps beside ``response`` from now on."""
    global _path
    _path = breadcrumb(response)


def enter(name: str) -> None:
    """The worker enters step ``name`` (a no-op outside a worker)."""
    global _current
    _current = name
    if _path is None:
        return
    torch = sys.modules.get("torch")
    doc = {"step": name, "torch": getattr(torch, "__version__", None)}
    try:  # a new file renamed over the name: never through what model code left there
        safefs.write_new(_path, json.dumps(doc))
    except OSError:  # a breadcrumb is never worth failing the work for
        pass


@dataclass(frozen=True)
class Death:
    """How a worker ended without answering."""

    returncode: int
    step: str | None = None
    torch: str | None = None
    frame: str | None = None  # the model's file:line where faulthandler saw the crash

    @property
    def signal(self) -> str | None:
        """``SIGSEGV``... when a signal killed it (a negative return code)."""
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"


def read(response: Path, returncode: int, log: str = "", base_dir: Path | None = None) -> Death:
    """What the breadcrumb and the log say about a worker that ended with ``returncode``
    and wrote no ``response``."""
    try:  # a plain file only: the worker's folder is the model code's to write
        doc = json.loads(safefs.read_regular(breadcrumb(response), 2**20))
    except (OSError, ValueError):
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    return Death(returncode, doc.get("step"), doc.get("torch"), crash_frame(log, base_dir))


_DESCRIPTIONS = {
    "SIGSEGV": "segmentation fault",
    "SIGABRT": "aborted",
    "SIGKILL": "killed: out of memory, or by another process",
    "SIGBUS": "bus error",
    "SIGILL": "illegal instruction",
    "SIGFPE": "arithmetic fault",
    "SIGTERM": "terminated",
}


def describe(death: Death, last_line: str) -> str:
    """One line: ``worker died by SIGSEGV (segmentation fault) in first call at
    model.py:12``, or, without a signal, ``worker exited with code 3 in build model:
    <its last line>``."""
    where = f" in {death.step}" if death.step else ""
    if death.signal is None:
        return f"worker exited with code {death.returncode}{where}: {last_line}"
    what = _DESCRIPTIONS.get(death.signal)
    at = f" at {death.frame}" if death.frame else ""
    return f"worker died by {death.signal}{f' ({what})' if what else ''}{where}{at}"


# faulthandler: '  File "/path/model.py", line 12 in forward' (most recent call first)
_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in ')
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def crash_frame(log: str, base_dir: Path | None = None) -> str | None:
    """The innermost frame of the model's own code in the last stack faulthandler
    wrote to ``log``: not torch's, gatekeeper's or Python's library."""
    from ..worker.deps import is_stdlib

    block = log.rsplit("Fatal Python error", 1)
    if len(block) < 2:
        return None
    for line in block[1].splitlines():
        m = _FRAME.match(line)
        if not m:
            continue
        path = os.path.abspath(m.group(1))
        if (
            path.startswith(_OURS)
            or f"{os.sep}torch{os.sep}" in path
            or m.group(1).startswith("<")
            or is_stdlib(path)
        ):
            continue
        shown = path
        if base_dir is not None:
            try:
                shown = Path(path).relative_to(base_dir.resolve()).as_posix()
            except ValueError:
                pass
        return f"{shown}:{m.group(2)}"
    return None
