"""The parent's one door into a worker: run a request in a fresh Python process
with an isolated inductor cache dir, and read its :class:`Response`. No torch here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import WorkerError
from ..secrecy import seal, without_secrets
from . import steps
from .protocol import Build, Response


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


def run_worker(
    request: Build,
    *,
    cache_dir: Path,
    timeout: float,
    verbose: bool = False,
    label: str = "",
    env: dict[str, str] | None = None,
) -> Response:
    """Run ``request`` in a subprocess; returns its response (``ok`` true or false).

    Raises WorkerError only when the process dies without answering: a timeout, or
    :class:`WorkerDied` (a signal or an exit), naming the step the worker was in.
    """
    seal()  # before the first worker: this process's secrets out of its reach
    from .. import kinds

    how = kinds.get(request.kind.name).launch(request.model)
    if how.launcher is not None:
        from .ranks import run_ranks

        return run_ranks(
            request, how, cache_dir=cache_dir, timeout=timeout, verbose=verbose, label=label, env=env
        )
    with tempfile.TemporaryDirectory(prefix="gk-worker-") as tmp:
        req_path, resp_path = Path(tmp, "request.json"), Path(tmp, "response.json")
        log_path = Path(tmp, "worker.log")
        req_path.write_text(request.model_dump_json())
        writable = [cache_dir, Path(request.base_dir), Path(tmp)]
        cmd = worker_command(str(req_path), str(resp_path), writable=writable)
        with open(log_path, "wb") as log:
            try:
                proc = subprocess.run(
                    cmd,
                    env=cache_env(cache_dir, env),
                    timeout=timeout,
                    stdin=subprocess.DEVNULL,
                    stdout=None if verbose else log,
                    stderr=None if verbose else subprocess.STDOUT,
                )
            except subprocess.TimeoutExpired:
                step = steps.read(resp_path, 0).step
                during = f" in {step}" if step else ""
                raise WorkerError(
                    f"{label}: worker timed out after {timeout:.0f} s{during}"
                ) from None
        if resp_path.is_file():
            return Response.model_validate_json(resp_path.read_text())
        text = log_path.read_text(errors="replace")  # empty when it went to the terminal
        death = steps.read(resp_path, proc.returncode, text, request.base_path)
        raise WorkerDied(label, death, text)


class WorkerDied(WorkerError):
    """The worker ended without answering: a signal (``death.signal``) or an exit."""

    def __init__(self, label: str, death: steps.Death, log: str = "") -> None:
        tail = [ln for ln in log.splitlines() if ln.strip()]
        super().__init__(f"{label}: {steps.describe(death, tail[-1] if tail else 'no output')}")
        self.death = death


def run_or_fail(
    request: Build,
    *,
    cache_dir: Path,
    timeout: float,
    verbose: bool = False,
    label: str = "",
    env: dict[str, str] | None = None,
) -> Response:
    """:func:`run_worker`, with a dead worker turned into a failed response: one its
    kind says is its own on this machine (:meth:`gatekeeper.kinds.Kind.died`) is
    ``unavailable``."""
    from .. import kinds

    try:
        return run_worker(
            request, cache_dir=cache_dir, timeout=timeout, verbose=verbose, label=label, env=env
        )
    except WorkerDied as e:
        if said := kinds.get(request.kind.name).died(e.death, request.device):
            return Response.failure("unavailable", said)
        return Response.failure("compile", str(e))
    except WorkerError as e:
        return Response.failure("compile", str(e))
