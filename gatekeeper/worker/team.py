"""One rank of a distributed target, inside the worker: join the process group before
the model's factory runs, keep the ranks in step while measuring, and answer for this
rank.

torch's elastic agent started this process with ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set (:mod:`gatekeeper.boundary.elastic`).
:func:`join`:

* dies with its launcher (``PR_SET_PDEATHSIG``): a rank sits in a session of its own,
  where a signal to the launcher's group never reaches it;
* takes its share of the cores (``torch.set_num_threads``: the threads torch would use,
  divided among the node's ranks, as ``torchrun`` does) and, on CUDA, its device
  (``cuda:<local rank>``);
* joins the process group with the configured backend and timeout (a rank that waits
  longer in a collective fails, and the agent stops the others), and a gloo group of
  its own for gatekeeper's agreements, so they never count as the model's collectives;
* on Python < 3.12, makes ``DeviceMesh``'s hash stable across processes: torch 2.13
  pickles the mesh into the FX graph cache key of a tensor-parallel graph, with a hash
  that mixes in ``hash(None)``, an address on those Pythons, so every process missed.

:class:`Team` is what the measurement asks of the other ranks: one number of loops,
the same number of rounds, each round started together.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..boundary.protocol import Request, Response
from ..runtime import MESH_ENV

_PR_SET_PDEATHSIG = 1


@dataclass
class Team:
    rank: int
    local_rank: int
    world_size: int
    group: Any  # gatekeeper's own gloo group
    start_seq: int  # the model's collectives counted before the factory ran

    def max(self, value: float) -> float:
        """The largest ``value`` over the ranks."""
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return float(t.item())

    def any(self, flag: bool) -> bool:
        """Whether any rank says ``flag``."""
        return self.max(1.0 if flag else 0.0) > 0

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def collectives(self) -> int:
        """The model's collectives so far (every group's count but gatekeeper's own)."""
        total = 0
        for pg in list(getattr(dist.distributed_c10d._world, "pg_map", {})):
            if pg is self.group:
                continue
            try:
                total += int(pg._get_sequence_number_for_group())
            except (RuntimeError, AttributeError):
                continue
        return total


_team: Team | None = None


def current() -> Team | None:
    """This process's rank, when it is one of a distributed target's."""
    return _team


def _die_with_parent() -> None:
    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _stable_mesh_hash() -> None:
    if sys.version_info >= (3, 12):
        return
    try:
        from torch.distributed.device_mesh import DeviceMesh
    except ImportError:
        return
    stable = getattr(DeviceMesh, "_stable_hash", None)
    if stable is None:  # older torch: no mesh in the key to fix
        return

    def __hash__(self: Any) -> int:
        return int(stable(self)[:15], 16)

    DeviceMesh.__hash__ = __hash__  # type: ignore[method-assign]


def join(req: Request, backend: str) -> Team:
    """Set this rank up (see the module's docstring) and join the process group."""
    global _team
    _die_with_parent()
    dcfg = req.model.distributed
    assert dcfg is not None
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world, local_world = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])
    torch.set_num_threads(max(1, torch.get_num_threads() // local_world))
    if req.device.startswith("cuda"):
        torch.cuda.set_device(local)
    _stable_mesh_hash()
    dist.init_process_group(backend, timeout=timedelta(seconds=dcfg.timeout))
    group = dist.new_group(backend="gloo") if backend != "gloo" else dist.new_group()
    _team = Team(rank, local, world, group, 0)
    # what gatekeeper.device_mesh() builds in the factory (gatekeeper.runtime)
    mesh = {"device": req.device.split(":")[0], "world_size": world, "mesh": dcfg.mesh}
    os.environ[MESH_ENV] = json.dumps(mesh)
    _team.start_seq = _team.collectives()
    return _team


def localize(req: Request, team: Team) -> Request:
    """The request as this rank runs it: its own device, and what only one process
    may write (the Mega-Cache blob, the trace) left to rank 0; each rank's reference
    outputs beside rank 0's (:func:`gatekeeper.worker.parity.gather_references`)."""
    update: dict[str, Any] = {}
    if req.device.startswith("cuda"):
        update["device"] = f"cuda:{team.local_rank}"
    if team.rank != 0:
        for name in ("megacache_out", "trace_out"):
            if getattr(req, name, None):
                update[name] = None
        if ref := getattr(req, "reference_out", None):
            update["reference_out"] = f"{ref}.rank{team.rank}"
    return req.model_copy(update=update) if update else req


def finish(req: Request, team: Team, resp: Response) -> Response:
    """This rank's answer: its rank, and a config error when the model never used the
    process group."""
    if resp.ok and team.world_size > 1 and team.collectives() <= team.start_seq:
        resp = Response.failure(
            "config",
            f"model {req.model.name!r} is distributed, but its {team.world_size} ranks never "
            "called a collective: parallelize the model in the factory (DistributedDataParallel, "
            "fully_shard, parallelize_module)",
        )
    return resp.model_copy(update={"rank": team.rank})


def leave() -> None:
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # the answer is written; an unclean exit changes nothing
            pass
