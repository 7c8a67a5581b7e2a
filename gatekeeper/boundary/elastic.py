"""The launcher of a distributed target's ranks: ``python -m gatekeeper.boundary.elastic
SPEC.json OUT.json``, started (confined) by :func:`gatekeeper.boundary.ranks.run_ranks`
in place of one worker. It imports torch inside its functions (the parent imports
only its constants) and runs torch's own elastic agent in this process
(``elastic_launch``, what ``torchrun`` runs): one node,
``world_size`` ranks, each ``python -m gatekeeper.worker REQUEST RESPONSE.<rank>``, a
c10d rendezvous on 127.0.0.1 at a port the agent picks, no restarts, each rank's
output in its own log. When a rank raises, dies or exits, the agent stops the others
at once; OUT.json then says which rank failed first and how, in one line.

Before any rank starts it refuses what cannot run here: a backend torch lacks, NCCL
without CUDA, more ranks than CUDA devices (on CPU: than cores).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from .. import safefs

# what a rank reports when it only lost its peer (the root cause is elsewhere)
PEER_LOST = ("Connection closed by peer", "Connection reset", "Read error", "Broken pipe")


def refusal(backend: str, device: str, world_size: int) -> str | None:
    """Why ``world_size`` ranks with ``backend`` cannot run on ``device`` here."""
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        return f"this torch ({torch.__version__}) was built without torch.distributed"
    if not dist.is_backend_available(backend):
        return f"distributed.backend {backend!r} is not available in torch {torch.__version__} here"
    if device.startswith("cuda"):
        found = torch.cuda.device_count()
        if world_size > found:
            return (
                f"distributed.world_size {world_size} needs {world_size} CUDA devices, "
                f"this machine has {found}"
            )
    elif backend == "nccl":
        return 'distributed.backend "nccl" needs CUDA devices; on CPU use "gloo"'
    else:
        import os

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        if world_size > (cores or 1):
            return (
                f"distributed.world_size {world_size} needs a CPU core per rank, "
                f"this machine has {cores}"
            )
    return None


def one_line(failure: Any) -> str:
    """A failed rank in one line: its error file's message, else its signal or code."""
    data = failure.error_file_data or {}
    msg = data.get("message")
    text = msg.get("message", "") if isinstance(msg, dict) else str(msg or "")
    text = text.strip().splitlines()[0] if text.strip() else ""
    if text == "<NONE>":  # no error file: a signal, os._exit, or a plain non-zero exit
        text = ""
    if failure.exitcode < 0:
        return f"killed by {failure.signal_name()}" + (f": {text}" if text else "")
    return text or f"exited with code {failure.exitcode}"


def _rank_order(failure: Any) -> tuple:
    """Root cause first: a rank's own failure (an error, a signal the agent did not
    send), then one that only lost its peer, then one the agent stopped; then the
    earliest."""
    text = one_line(failure)
    stopped = failure.exitcode in (-15, -9) and ":" not in text
    peer = any(w in text for w in PEER_LOST)
    return (2 if stopped else 1 if peer else 0, failure.timestamp, failure.local_rank)


def launch(spec: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if why := refusal(spec["backend"], spec["device"], spec["world_size"]):
        return {"ok": False, "config": why}
    cfg = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=spec["world_size"],
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",  # the agent picks a free port (torchrun --standalone)
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
        local_addr="127.0.0.1",
        logs_specs=DefaultLogsSpecs(log_dir=spec["log_dir"], redirects=Std.ALL),
    )
    args = ["-m", "gatekeeper.worker", spec["request"], spec["responses"]]
    start = time.perf_counter()
    try:
        elastic_launch(cfg, sys.executable)(*args)
    except ChildFailedError as e:
        rank, first = min(e.failures.items(), key=lambda kv: _rank_order(kv[1]))
        return {
            "ok": False,
            "rank": rank,
            "exitcode": first.exitcode,
            "line": one_line(first),
            "failures": {str(r): one_line(f) for r, f in e.failures.items()},
            "seconds": time.perf_counter() - start,
        }
    return {"ok": True, "seconds": time.perf_counter() - start}


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    try:
        out = launch(spec)
    except Exception as e:  # the agent itself failed: say so in one line
        out = {"ok": False, "line": f"the launcher failed: {type(e).__name__}: {e}"}
    safefs.write_new(argv[1], json.dumps(out))  # never through what a rank left there
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
