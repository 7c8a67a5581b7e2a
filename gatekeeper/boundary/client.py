"""The parent's one door into a worker: run a request in a fresh Python process
with an isolated inductor cache dir, and read its :class:`Response`. No torch here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from .. import safefs
from ..errors import WorkerError
from ..git import resolve as resolve_git
from ..scratch import scratch_dir
from ..secrecy import seal
from . import box, breadcrumbs, headers
from .protocol import Build, DepsRequest, Response
from .spawn import (
    answered,
    cache_env,
    configs_of,
    devices_for,
    headers_worker,
    read_answer,
    worker_command,
    worker_folders,
    writable_for,
)

__all__ = ["WorkerDied", "cache_env", "run_or_fail", "run_worker"]


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
    resolve_git()  # and git found where the worker cannot plant another
    from .. import kinds

    how = kinds.get(request.kind.name).launch(request.model)
    if how.launcher is not None:
        from .ranks import run_ranks

        return run_ranks(
            request,
            how,
            cache_dir=cache_dir,
            timeout=timeout,
            verbose=verbose,
            label=label,
            env=env,
        )
    parts = kinds.get(request.kind.name).headers if request.device == "cpu" else ()
    shared = headers.ensure(headers_worker, parts, forkable=forkable(request))
    timeout = box.max_timeout(timeout)
    with scratch_dir("gk-worker-") as tmp:
        # the run's folder is the parent's (the request, the log); the worker writes in
        # its own folder only (its temp dir, its answer), read back without following
        # a link (docs/hardening.md, "The parent's files")
        run, own = worker_folders(Path(tmp))
        req_path, log_path = run / "request.json", run / "worker.log"
        resp_path = own / "response.json"
        safefs.write_new(req_path, request.model_dump_json())
        writable = [*writable_for(cache_dir, request), own]
        run_env = cache_env(cache_dir, env, request.pass_env) | {"TMPDIR": str(own)}
        headers.lend(shared, own, run_env, parts=parts)
        cmd = worker_command(
            str(req_path),
            str(resp_path),
            writable=writable,
            scratch=run,
            config_dirs=configs_of(request),
            devices=devices_for(request.device),
        )
        with safefs.new_file(log_path) as log:
            started = box.start(
                cmd,
                env=run_env,
                stdin=subprocess.DEVNULL,
                stdout=None if verbose else log,
                stderr=None if verbose else subprocess.STDOUT,
                forkable=forkable(request),
                # a build alone (key's deps) compiles nothing: no ISA check for it
                isa_check=None if isinstance(request, DepsRequest) else headers.isa_check(shared),
            )
            _wait(started, timeout, resp_path, label)
        if answered(resp_path):
            resp = Response.model_validate_json(read_answer(resp_path, label or "worker"))
            from ..runtime import confirm_facts

            confirm_facts(resp.facts)  # what the parent remembered, against the worker's
            return resp
        text = safefs.read_tail(log_path)  # empty when it went to the terminal
        death = breadcrumbs.read(resp_path, started.proc.returncode or 0, text, request.base_path)
        raise WorkerDied(label, death, text)


def forkable(request: Build) -> bool:
    """Whether ``request``'s worker may be forked from a warm server
    (:mod:`gatekeeper.boundary.forks`): on the CPU, and not a probe (which times a new
    process's first call, its imports included)."""
    return request.device == "cpu" and getattr(request, "action", None) != "probe"


def _wait(started: box.Boxed, timeout: float, resp_path: Path, label: str) -> None:
    """Wait for the boxed worker; at the time limit kill it and raise naming its step;
    raise where its box ended it (a limit)."""
    proc = started.proc
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        started.close()
        step = breadcrumbs.read(resp_path, 0).step
        during = f" in {step}" if step else ""
        raise WorkerError(f"{label}: worker timed out after {timeout:.0f} s{during}") from None
    except BaseException:  # interrupted: the box (and all in it) ends with us
        proc.kill()
        proc.wait()
        started.close()
        raise
    if (ended := started.ended()) is not None:
        raise WorkerError(f"{label}: the box ended the worker: {ended}")


class WorkerDied(WorkerError):
    """The worker ended without answering: a signal (``death.signal``) or an exit."""

    def __init__(self, label: str, death: breadcrumbs.Death, log: str = "") -> None:
        tail = [ln for ln in log.splitlines() if ln.strip()]
        super().__init__(
            f"{label}: {breadcrumbs.describe(death, tail[-1] if tail else 'no output')}"
        )
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
