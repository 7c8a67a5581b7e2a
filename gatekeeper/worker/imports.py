"""What every worker imports before its action: torch, Dynamo, inductor's compile
modules and the worker's own, the same in a fresh worker (:func:`gatekeeper.worker.
__main__.handle`) and in the warm server its children are forked from
(:mod:`gatekeeper.worker.server`). So a target reads the same figures forked as fresh
(docs/configuration.md, "Forked workers"): its compile seconds count no module import,
and the modules a model's build finds loaded, which decide the dependencies it records
(:class:`gatekeeper.worker.deps.Recorder`, the key's code hash), are the same for every
action. A probe imports nothing ahead: it times a new process's first call, imports
included.

Then the objects the imports made are moved out of the cyclic collector's sight
(:func:`gc.freeze`): they live as long as the process, and each full collection during
a compile would walk them all again (in a fresh worker, about 0.5 s of the quick start's
compile seconds); in a server's child the walk would also write to each of them and copy
the server's pages into the child, as Python's documentation warns for fork without
exec.
"""

from __future__ import annotations

import gc

_done = False


def preload() -> None:
    """Import what every worker's action imports, once per process, and freeze it."""
    global _done
    if _done:
        return
    import torch
    import torch._dynamo
    import torch._inductor.codecache
    import torch._inductor.compile_fx  # noqa: F401

    from . import compile, headers, measure, model, verify  # noqa: F401

    _done = True
    gc.freeze()
