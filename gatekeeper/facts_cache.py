"""What this machine's torch said about its CPU, remembered between commands, so that a
parent process keys a bundle without importing torch (about 3.5 CPU-seconds, most of
what a command that finds its bundles costs).

:func:`gatekeeper.runtime.torch_facts` and :func:`~gatekeeper.runtime.resolve_device`
ask here first. An answer is kept under a fingerprint of everything it follows from,
read without importing torch: the interpreter, torch's installed files (the path, size
and time of its ``__init__.py``, ``version.py`` and CPU library, and what ``version.py``
says), the CPU (its model and flags, the CPUs this process may run on), the GPU device
nodes present and the variables torch's thread count, CPU dispatch and device discovery
read. Any change to one of them is a new fingerprint, and torch is asked again. Only CPU
answers are kept: where torch sees a GPU it is asked every time.

The answers live in the user's cache dir (``$XDG_CACHE_HOME/gatekeeper/torch-facts/``,
outside every folder a worker's box may write: docs/hardening.md). A file that cannot be
read or has the wrong shape is ignored, and nothing is kept where a worker may write (a
cache dir under the temp dir); ``GATEKEEPER_FACTS_CACHE=off`` asks torch always.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from . import safefs
from .boundary import box

VERSION = 1
# what torch's thread count, CPU dispatch and device discovery read from the environment
# (and which libraries it loads: another OpenMP runtime counts threads its own way)
_ENV_PREFIXES = (
    "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "ATEN_", "CUDA_", "HIP_", "ROCR_",
    "PYTORCH_", "TORCH_", "LD_LIBRARY_PATH", "LD_PRELOAD",
)  # fmt: skip
_GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")
_TORCH_FILES = ("__init__.py", "version.py", "lib/libtorch_cpu.so", "lib/libtorch_cpu.dylib")


def enabled() -> bool:
    """On unless ``GATEKEEPER_FACTS_CACHE=off``, and never where model code may run
    unconfined (``GATEKEEPER_UNCONFINED``: its box may not hold, and the user's home is
    then the model's to write)."""
    if box.unconfined_allowed():
        return False
    return os.environ.get("GATEKEEPER_FACTS_CACHE", "").strip().lower() not in ("off", "0")


def folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gatekeeper" / "torch-facts"


@lru_cache(maxsize=1)
def _cpu() -> tuple[str, ...]:
    """The CPU's model and flags (read once per process, as the env key's ISA flags are:
    /proc/cpuinfo grows with the cores, and every target's key asks twice)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return (platform.processor(),)
    wanted = ("model name", "flags", "Features", "CPU part", "CPU implementer")
    lines = {ln.strip() for ln in text.splitlines() if ln.split(":")[0].strip() in wanted}
    return tuple(sorted(lines))


def fingerprint() -> str | None:
    """A hash of what torch's CPU answers follow from; None where torch is not installed."""
    spec = importlib.util.find_spec("torch")  # finds, does not import
    if spec is None or spec.origin is None:
        return None
    root = Path(spec.origin).parent
    files: list[list[object]] = []
    for name in _TORCH_FILES:
        with contextlib.suppress(OSError):
            st = (root / name).stat()
            files.append([name, st.st_size, st.st_mtime_ns, st.st_ino])
    with contextlib.suppress(OSError):  # its version and git hash, whatever the times say
        files.append(["version.py", hashlib.sha256((root / "version.py").read_bytes()).hexdigest()])
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    doc = {
        "version": VERSION,
        "python": [os.path.realpath(sys.executable), sys.version],
        "torch": [str(root), files],
        "cpu": [platform.machine(), os.cpu_count(), affinity, _cpu()],
        "gpu_nodes": [p for p in _GPU_NODES if os.path.exists(p)],
        "env": sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


def _writable_by_workers(path: Path) -> bool:
    """Whether ``path`` lies where a worker's box may write (the temp dir, ``/dev/shm``):
    facts kept there could be changed by model code, and with them the env key."""
    where = path.resolve()
    shared = [Path(tempfile.gettempdir()), Path("/dev/shm")]
    return any(where.is_relative_to(p.resolve()) for p in shared)


def _path() -> Path | None:
    where = folder()
    if not enabled() or _writable_by_workers(where) or (fp := fingerprint()) is None:
        return None
    return where / f"{fp}.json"


def _read(path: Path) -> dict[str, Any]:
    try:  # a plain file only (a FIFO an unconfined model left there is never waited on)
        doc = json.loads(safefs.read_regular(path, 2**20))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def recall(question: str) -> Any:
    """The remembered answer to ``question`` (``auto``: the device ``auto`` resolves to;
    ``facts:cpu``: :func:`~gatekeeper.runtime.torch_facts` of the CPU), or None."""
    path = _path()
    return None if path is None else _read(path).get(question)


_replaced = 0  # how many remembered answers this process found wrong and replaced
log = logging.getLogger("gatekeeper.facts")


def confirm(
    question: str, theirs: Any, valid: Callable[[Any], bool], ask: Callable[[], Any]
) -> None:
    """A worker said ``theirs`` to ``question`` (before any model code ran): where it
    contradicts the remembered answer, this process asks (``ask``: its own torch) and,
    where that contradicts it too, replaces the remembered one, with a warning. Model
    code that once ran unconfined may have written the answers, and with them the env
    key a bundle is filed under."""
    remembered = recall(question)
    if not valid(theirs) or not valid(remembered) or theirs == remembered:
        return
    own = ask()
    if own == remembered:
        return  # the worker's environment differs, not the memory
    replace(question, own)
    log.warning(
        "the remembered torch facts (%s) contradict the worker's (%s): replaced by this "
        "process's own (%s)",
        _shown(remembered),
        _shown(theirs),
        _shown(own),
    )


def _shown(doc: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(doc.items()) if k not in ("device", "torch_git"))


def replaced() -> int:
    """How many remembered answers this process replaced (:func:`replace`)."""
    return _replaced


def replace(question: str, answer: Any) -> None:
    """A remembered answer found wrong: ``answer`` in its place (a key made with the
    old one is made again: :func:`replaced`)."""
    global _replaced
    _replaced += 1
    remember(question, answer)


def remember(question: str, answer: Any) -> None:
    """Keep ``answer``; a cache dir that cannot be written is left as it is."""
    if (path := _path()) is None:
        return
    doc = _read(path) | {question: answer}
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".facts-")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, sort_keys=True)
            os.replace(tmp, path)
        except OSError:
            Path(tmp).unlink(missing_ok=True)
