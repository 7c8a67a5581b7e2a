"""A distributed target's worker, parent side (no torch): start its launcher
(:mod:`gatekeeper.boundary.elastic`, confined like any worker, in a session of its own),
which starts the ranks through torch's elastic agent; wait with a wall-clock limit;
then read every rank's answer and merge them into one (:mod:`gatekeeper.boundary.merge`).

A rank that fails ends the target with one line naming it: its own error (read from its
answer) before a rank that only lost its peer, before one the agent stopped. At the time
limit the launcher gets SIGTERM (its agent stops every rank), SIGKILL after a grace, and
whatever still carries this run's marker in its environment is killed: ranks live in
sessions of their own, and each also dies with its launcher (``PR_SET_PDEATHSIG``,
:mod:`gatekeeper.worker.team`). No process outlives the target.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .. import safefs
from ..errors import WorkerError
from ..scratch import scratch_dir
from . import box, breadcrumbs, headers
from .elastic import PEER_LOST
from .merge import merge
from .protocol import Build, Response
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

if TYPE_CHECKING:
    from ..kinds import Launch

MARKER = "GATEKEEPER_RUN"  # in every rank's environment: what the sweep looks for
GRACE = 10.0  # seconds the launcher has to stop its ranks after SIGTERM


def backend_of(request: Build) -> str:
    """The process group's backend: the configured one, or NCCL on CUDA, gloo on CPU."""
    assert request.model.distributed is not None
    chosen = request.model.distributed.backend
    if chosen != "auto":
        return chosen
    return "nccl" if request.device.startswith("cuda") else "gloo"


def leftovers(marker: str) -> list[int]:
    """The processes that carry ``marker`` in their environment (this run's ranks)."""
    found = []
    needle = f"{MARKER}={marker}".encode()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            if needle in (p / "environ").read_bytes().split(b"\0"):
                found.append(int(p.name))
        except OSError:
            continue
    return found


def sweep(marker: str) -> list[int]:
    """Kill what is left of a run; the pids killed."""
    pids = leftovers(marker)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the launcher's session (its agent stops the ranks), SIGKILL after GRACE."""
    for sig, wait in ((signal.SIGTERM, GRACE), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher's session at once (its box's init dies, and with it every
    rank), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_ranks(
    request: Build,
    how: Launch,
    *,
    cache_dir: Path,
    timeout: float,
    verbose: bool = False,
    label: str = "",
    env: dict[str, str] | None = None,
) -> Response:
    """Run ``request`` as ``how.ranks`` ranks; the merged response (``ok`` false: the
    failing rank's answer, named), or WorkerError naming the rank that died or the
    step each rank was in at the time limit."""
    assert how.launcher is not None
    shared = headers.ensure(headers_worker)
    timeout = box.max_timeout(timeout)
    with scratch_dir("gk-ranks-") as tmp:
        # the run's folder is the parent's (request, spec, log); the launcher and its
        # ranks write in their own folder only (answers, the agent's logs, temp files)
        run, own = worker_folders(Path(tmp))
        req_path, out_path = run / "request.json", own / "launched.json"
        safefs.write_new(req_path, request.model_dump_json())
        spec = {
            "world_size": how.ranks,
            "backend": backend_of(request),
            "device": request.device,
            "request": str(req_path),
            "responses": str(own / "response.${local_rank}.json"),
            "log_dir": str(own / "logs"),
        }
        spec_path = run / "spec.json"
        safefs.write_new(spec_path, json.dumps(spec))
        marker = uuid.uuid4().hex
        run_env = cache_env(cache_dir, env, request.pass_env) | {
            MARKER: marker,
            # one hash seed in every rank: the same graph gives every rank the same key
            "PYTHONHASHSEED": "0",
            "TMPDIR": str(own),  # what the ranks leave there goes with the run
        }
        headers.lend(shared, own, run_env)
        writable = [*writable_for(cache_dir, request), own]
        cmd = worker_command(
            str(spec_path),
            str(out_path),
            writable=writable,
            scratch=run,
            config_dirs=configs_of(request),
            module=how.launcher,
            private_net=True,
            devices=devices_for(request.device),
        )
        with safefs.new_file(run / "launcher.log") as log:
            started = box.start(
                cmd,
                env=run_env,
                stdin=subprocess.DEVNULL,
                stdout=None if verbose else log,
                stderr=None if verbose else subprocess.STDOUT,
                start_new_session=True,
            )
            _wait(started, timeout, marker, label, lambda: _steps(own, how.ranks))
        launched = json.loads(read_answer(out_path, label)) if answered(out_path) else {}
        if launched.get("config"):
            return Response.failure("config", launched["config"])
        answers = _answers(own, how.ranks)
        if launched.get("ok") and all(a is not None and a.ok for a in answers):
            return merge([a for a in answers if a is not None])
        code = started.proc.returncode
        return _failed(label, launched, answers, own, code, request.base_path)


def _wait(
    started: box.Boxed, timeout: float, marker: str, label: str, steps: Callable[[], str]
) -> None:
    """Wait for the launcher; at the time limit stop it and raise naming each rank's
    step (``steps``); afterwards sweep what is left, and raise where the box ended it."""
    proc = started.popen
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        started.close()
        sweep(marker)
        raise WorkerError(f"{label}: ranks timed out after {timeout:.0f} s ({steps()})") from None
    except BaseException:  # interrupted: the box (launcher, ranks) ends with us
        _kill(proc)
        started.close()
        raise
    time.sleep(0.05)
    sweep(marker)  # a rank the agent could not stop (it never should be there)
    if (ended := started.ended()) is not None:
        raise WorkerError(f"{label}: the box ended the ranks: {ended}")


def _log_tail(tmp: Path, rank: int) -> str:
    """The end of a rank's output, from the agent's per-rank logs."""
    for path in sorted(tmp.glob(f"logs/*/attempt_*/{rank}/stderr.log")):
        if text := safefs.read_tail(path, 20000):
            return text
    return ""


def _late(tmp: Path, answers: list[Response | None], root: int) -> str:
    """After a rank timed out in a collective: the ranks that never answered and the
    step each was in (the late one is among them)."""
    late = [n for n, a in enumerate(answers) if a is None and n != root]
    said = [f"rank {n} did not answer (in {_step(tmp, n)})" for n in late]
    return f"; {', '.join(said)}" if said else ""


def _step(tmp: Path, rank: int) -> str:
    return breadcrumbs.read(tmp / f"response.{rank}.json", 0).step or "start-up"


def _answers(tmp: Path, ranks: int) -> list[Response | None]:
    found: list[Response | None] = []
    for rank in range(ranks):
        path = tmp / f"response.{rank}.json"
        text = read_answer(path, f"rank {rank}") if answered(path) else None
        found.append(Response.model_validate_json(text) if text is not None else None)
    return found


def _steps(tmp: Path, ranks: int) -> str:
    """Where each rank was: ``rank 0 in measure, rank 1 in compile``."""
    return ", ".join(f"rank {rank} in {_step(tmp, rank)}" for rank in range(ranks))


def _failed(
    label: str,
    launched: dict,
    answers: list[Response | None],
    tmp: Path,
    code: int | None,
    base_dir: Path,
) -> Response:
    """The failing rank's answer, named; a rank that died without answering raises."""
    lines = launched.get("failures") or {}
    errors: dict[int, tuple[str, str | None]] = {}  # rank -> (line, a failed answer's fault)
    for rank, answer in enumerate(answers):
        if answer is not None and not answer.ok:
            errors[rank] = (answer.error or "failed", answer.fault)
        elif str(rank) in lines:
            errors[rank] = (lines[str(rank)], None)
    if not errors:
        line = launched.get("line") or f"the launcher exited with code {code}"
        raise WorkerError(f"{label}: {line}")

    def order(rank: int) -> tuple:
        text, fault = errors[rank]
        stopped = fault is None and text in ("killed by SIGTERM", "killed by SIGKILL")
        peer = any(w in text for w in PEER_LOST)
        return (2 if stopped else 1 if peer else 0, 0 if fault else 1, rank)

    root = min(errors, key=order)
    text, fault = errors[root]
    same = len(errors) == len(answers) and len({t for t, _ in errors.values()}) == 1
    named = text if same and fault is not None else f"rank {root}: {text}"
    if any(w in text.lower() for w in ("timed out", "timeout")):
        named += _late(tmp, answers, root)
    if fault is None:
        log = _log_tail(tmp, root)
        death = breadcrumbs.read(tmp / f"response.{root}.json", 0, log, base_dir)
        step = f" (in {death.step})" if death.step else ""
        at = f" at {death.frame}" if death.frame else ""
        last = log.strip().splitlines()[-1][:200] if log.strip() else ""
        raise WorkerError(
            f"{label}: {named}{step}{at}" + (f"; last output: {last}" if last else "")
        )
    return Response.failure(fault, named)
