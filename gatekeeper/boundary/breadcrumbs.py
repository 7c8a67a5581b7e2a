"""Where the worker is, for the parent to read when the worker dies without answering.

The worker records each step it enters (``build model``, ``export``,
``aoti_compile_and_package``, ``load package``, ``first call``, ``measure``...) in a small
JSON file beside its response (``<response>.step``, replaced atomically, with torch's
version once torch is imported). A worker killed by a signal (SIGSEGV in torch's C++ or
the model's native code, SIGABRT from a failed C++ check, SIGKILL from the OOM killer)
leaves that file behind, and :func:`describe` turns the death into one line: the signal,
the step, the model's own line where Python's faulthandler (enabled in the worker)
wrote the crashing thread's stack into the worker's log, and the native frame that
crashed where torch's own fatal-signal handler (armed by :func:`enter` once the worker
has imported torch) wrote the C++ stacks after it.

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
_armed = False


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
    if torch is not None and not _armed:
        arm_native_stacks(torch)
    doc = {"step": name, "torch": getattr(torch, "__version__", None)}
    try:  # a new file renamed over the name: never through what model code left there
        safefs.write_new(_path, json.dumps(doc))
    except OSError:  # a breadcrumb is never worth failing the work for
        pass


def arm_native_stacks(torch: object) -> None:
    """In a worker that has imported torch: on SIGSEGV, SIGBUS, SIGILL or SIGFPE, torch's
    C++ handler (``c10::FatalSignalHandler``) writes every thread's native stack to
    the log after faulthandler's Python stack, then the worker dies by the signal as
    before (faulthandler runs first and hands the signal on to it). SIGABRT stays
    faulthandler's alone: glibc aborts on a corrupted heap with its lock held, and that
    handler's allocations could then hang the worker instead of ending it. Where torch
    has no such handler, or not in the main thread, nothing (tried again at the next
    step)."""
    import faulthandler
    import signal
    import threading

    global _armed
    setter = getattr(getattr(torch, "_C", None), "_set_print_stack_traces_on_fatal_signal", None)
    if setter is None or threading.current_thread() is not threading.main_thread():
        return
    _armed = True
    was = faulthandler.is_enabled()
    try:
        faulthandler.disable()  # torch's handler installed under faulthandler's, not over
        setter(True)
        signal.signal(signal.SIGABRT, signal.SIG_DFL)
    except (ValueError, OSError, RuntimeError):  # pragma: no cover - a torch without it
        pass
    if was:
        faulthandler.enable(all_threads=False)


@dataclass(frozen=True)
class Death:
    """How a worker ended without answering."""

    returncode: int
    step: str | None = None
    torch: str | None = None
    frame: str | None = None  # the model's file:line where faulthandler saw the crash
    native: str | None = None  # the native frame that crashed (torch's C++, a package's)

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
    return Death(
        returncode,
        doc.get("step"),
        doc.get("torch"),
        crash_frame(log, base_dir),
        native_frame(log),
    )


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
    model.py:12``, then, where native code crashed, ``; native frame: <function>
    (<library>)``, or, without a signal, ``worker exited with code 3 in build model:
    <its last line>``."""
    where = f" in {death.step}" if death.step else ""
    if death.signal is None:
        return f"worker exited with code {death.returncode}{where}: {last_line}"
    what = _DESCRIPTIONS.get(death.signal)
    at = f" at {death.frame}" if death.frame else ""
    native = f"; native frame: {death.native}" if death.native else ""
    return f"worker died by {death.signal}{f' ({what})' if what else ''}{where}{at}{native}"


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


# c10::FatalSignalHandler: a header per thread, then its frames, innermost first:
# 'SIGSEGV(11), PID: 6320, Thread 6320: ' / 'frame #3: at::foo(int) + 0x8f (0x7fe4 in /p/libx.so)'
_THREAD = re.compile(r"^SIG\w+\(\d+\), PID: \d+, Thread \d+:")
_NATIVE = re.compile(r"^\s*frame #\d+: (.*) \(0x[0-9a-f]+ in (.+)\)\s*$")
_RAISED = re.compile(r"^(gsignal|raise|pthread_kill|__pthread_kill\w*)\b")
_UNKNOWN = re.compile(r"^<unknown function> \+ (0x[0-9a-f]+)$")
# the C library, the loader and the interpreter's own: the handler's machinery, or
# Python code running (a ctypes call), never what names torch's crash
_SYSTEM = re.compile(
    r"(^|/)(libc|libpthread|ld-linux[\w-]*|libffi|libpython[\d.]*)\.so|/lib-dynload/|/bin/python"
)
_THREADS = re.compile(r"(^|/)(libgomp|libiomp\d*|libomp|libtbb)[\w.-]*\.so")  # OpenMP's own
_SHOWN = 160  # a function's characters shown at most

Frame = tuple[str, str]  # (function as printed, library path)


def _crashed_thread(log: str) -> list[Frame | None] | None:
    """The frames of the thread whose signal torch's handler caught (None: a frame of
    the interpreter's, where it omitted Python's), past the handler and the signal's
    re-raise by faulthandler; None when the log holds no such stacks."""
    blocks: list[list[str]] = []
    for line in log.splitlines():
        if _THREAD.match(line):
            blocks.append([])
        elif blocks:
            blocks[-1].append(line)
    crashed = next((b for b in blocks if any("fatalSignalHandler" in ln for ln in b[:3])), None)
    if crashed is None:
        return None
    frames: list[Frame | None] = []
    for line in crashed:
        if "<omitting python frames>" in line:
            frames.append(None)
        elif m := _NATIVE.match(line):
            frames.append((m.group(1), m.group(2)))
    raised = [i for i, f in enumerate(frames) if f is not None and _RAISED.match(f[0])]
    return frames[raised[-1] + 1 if raised else 2 :]


def native_frame(log: str) -> str | None:
    """The native frame that crashed, from the stacks torch's fatal signal handler wrote
    to ``log`` (:func:`arm_native_stacks`): the crashing thread's innermost frame outside
    the C library and the interpreter, as ``function (library)``; an unnamed one as
    ``library+0xoffset``, named by ``addr2line`` where it is torch's own library, and
    followed by the innermost named frame that called it (``in cpp_fused_add_0
    (library)``: a package's kernel run by OpenMP's threads). None when there is none:
    no such stacks, or Python code crashed (a ctypes call: faulthandler's line names
    it)."""
    frames = _crashed_thread(log)
    site = None
    for i, f in enumerate(frames or []):
        if f is None:  # the interpreter from here: nothing native crashed
            return None
        if "FatalSignalHandler" not in f[0] and not _SYSTEM.search(f[1]):
            site = i
            break
    if frames is None or site is None:
        return None
    function, library = frames[site]  # type: ignore[misc]
    unknown = _UNKNOWN.match(function)
    if not unknown:
        return f"{_short(function)} ({_library(library)})"
    named = _symbol(library, unknown.group(1))
    if named:
        return f"{_short(named)} ({_library(library)}+{unknown.group(1)})"
    shown = f"{_library(library)}+{unknown.group(1)}"
    for f in frames[site + 1 :]:
        if f is None or _SYSTEM.search(f[1]):
            break
        if not _UNKNOWN.match(f[0]) and not _THREADS.search(f[1]):
            return f"{shown} in {_short(f[0])} ({_library(f[1])})"
    return shown


def _library(path: str) -> str:
    """A library's file name, a long generated one (an AOTInductor package's
    ``<52 characters>.wrapper.so``) cut to its first 8 characters and its suffix."""
    name = os.path.basename(path)
    stem, dot, suffix = name.partition(".")
    return f"{stem[:8]}...{dot}{suffix}" if len(stem) > 32 else name


def _short(function: str) -> str:
    """A C++ function as printed (``void ns::f<int, ...>(char*, long) const + 0x1f``)
    without its offset, parameters, template arguments and return type: ``ns::f<...>``."""
    text = re.sub(r" \+ (0x[0-9a-f]+|\d+)$", "", function).strip()
    text = re.sub(r"\s*(const|volatile|&|&&|noexcept)$", "", text)
    if text.endswith(")"):  # its parameters: the balanced group at the end
        depth = 0
        for i in range(len(text) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(text[i], 0)
            if depth == 0:
                text = text[:i] if i else text
                break
    word: list[str] = []
    angle = paren = 0
    for ch in text:  # template arguments folded; a return type (before a top space) gone
        if ch == "<":
            angle += 1
            if angle == 1:
                word.append("<...>")
            continue
        if ch == ">" and angle:
            angle -= 1
            continue
        if angle:
            continue
        paren += {"(": 1, ")": -1}.get(ch, 0)
        if ch == " " and not paren and not "".join(word).endswith("operator"):
            word = []
            continue
        word.append(ch)
    text = "".join(word) or text
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _symbol(library: str, offset: str) -> str | None:
    """The function at ``offset`` in one of torch's own libraries, by ``addr2line``
    (its symbol table names what the dynamic one does not); None for any other
    library, without ``addr2line``, or when it cannot say."""
    import importlib.util
    import shutil
    import subprocess

    spec = importlib.util.find_spec("torch")  # found, not imported
    roots = list(spec.submodule_search_locations or []) if spec else []
    path = os.path.realpath(library)
    tool = shutil.which("addr2line")
    if tool is None or not any(path.startswith(os.path.realpath(r) + os.sep) for r in roots):
        return None
    try:
        done = subprocess.run(
            [tool, "-f", "-C", "-e", path, offset], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    name = done.stdout.splitlines()[0].strip() if done.stdout.strip() else ""
    return name if done.returncode == 0 and name and name != "??" else None
