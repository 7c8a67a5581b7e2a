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
    import torch._inductor.compile_fx
    import torch._inductor.cpu_vec_isa
    import torch.utils.cpp_extension  # what the ISA check imports (setuptools, packaging)

    from . import compile, headers, measure, model, verify  # noqa: F401

    torch._inductor.codecache.torch_key()  # a hash of torch's sources, once per process
    _done = True
    gc.freeze()


_isa_checked = False


def check_isa() -> None:
    """Inductor's check of the CPU's vector instructions, which a process's first CPU
    compile makes otherwise (inside its compile seconds): each ISA check library, built
    by the header worker and lent into this process's cache dir, loaded by a new Python
    process (six on an AVX-512 CPU, about 1 s here; ``cpu_vec_isa._probe_load``). Its
    answer is kept for the process (inductor's own caches): a server's children inherit
    it. Not for a probe, which times a deploy's first call, this check included."""
    global _isa_checked
    if _isa_checked:
        return
    from torch._inductor import cpu_vec_isa

    cpu_vec_isa.pick_vec_isa()
    _isa_checked = True
    gc.freeze()
