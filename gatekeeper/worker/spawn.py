"""How a worker process starts, for both doors into one (:mod:`gatekeeper.worker.launch`,
one process; :mod:`gatekeeper.worker.ranks`, a distributed target's ranks): its
environment and its confined command line. No torch here.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from ..secrecy import without_secrets


def cache_env(cache_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a compile: this cache dir only, FX graph and AOT caches on;
    ``extra``: what a deploy's service sets besides (see :func:`gatekeeper.warm.service_env`).
    Secrets (:func:`gatekeeper.secrecy.is_secret`) are dropped: the worker runs the
    user's model code."""
    env = without_secrets(os.environ) | (extra or {})
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    env["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "1"
    env["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "1"
    # Triton's kernels then land inside the inductor cache dir (<cache>/triton/<device>)
    env.pop("TRITON_CACHE_DIR", None)
    # no current directory on sys.path: a gatekeeper/ folder there must not shadow us
    env["PYTHONSAFEPATH"] = "1"
    # the profiler (CPU peak memory) must not print its start/stop lines into our logs
    env.setdefault("KINETO_LOG_LEVEL", "6")
    return env


def protected_dirs(writable: list[Path]) -> list[str]:
    """What no worker may write: this Python's installation, every folder on the parent's
    import path and gatekeeper's package (code the parent, holding the signing key, may
    import later, and the action's later steps run), but for a folder that holds one the
    worker writes in (``writable``, the current directory, the temp dir)."""
    here = Path(__file__).resolve().parents[1]
    places = [Path(p).resolve() for p in [*writable, Path.cwd(), Path(tempfile.gettempdir())]]
    found: list[Path] = []
    for entry in sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, str(here), *sys.path}):
        path = Path(entry).resolve() if entry else None
        if path is None or not path.is_dir() or path == Path(path.anchor):
            continue
        if any(p == path or path in p.parents for p in places):
            continue
        found.append(path)
    return [str(p) for p in found if not any(q in p.parents for q in found)]


def worker_command(
    *args: str, writable: list[Path], module: str = "gatekeeper.worker"
) -> list[str]:
    """``python -m gatekeeper.worker ARGS``; on Linux started confined (``confine.py``:
    no capability or namespace to read its ancestors' memory, and the parent's code
    read-only, before any code of the model or of its site-packages runs). A
    distributed target's ``module`` is its launcher: the ranks it starts are its
    children, confined alike."""
    cmd = [sys.executable, "-m", module, *args]
    if sys.platform != "linux":
        return cmd
    confine = [sys.executable, "-I", "-S", str(Path(__file__).with_name("confine.py"))]
    for path in protected_dirs(writable):
        confine += ["--read-only", path]
    return [*confine, *cmd]
