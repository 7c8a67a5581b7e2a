"""An ``+aot`` target's AOTInductor package in a fresh worker, loaded the way a deploy
loads it (:func:`gatekeeper.runtime.load_package`, torch's C++ loader):

* ``probe`` (``warm --probe``): ``import torch`` timed apart, then the package loaded and
  its first call made: what a service pays after ``gatekeeper warm``; and whether that
  imported inductor (it should not).
* ``aot`` (``check``'s verification): the first call's outputs compared with eager's and
  with the check's own outputs (the parity ladder). Verified only when both pass.

Nothing here imports torch before the probe has timed that import.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from . import steps

if TYPE_CHECKING:
    from .protocol import Request, Response


def probe(req: Request) -> Response:
    from .protocol import Response

    start = time.perf_counter()
    import torch

    imports = time.perf_counter() - start
    if not req.aot_in or not Path(req.aot_in).is_file():
        return Response.failure(
            "compile",
            "no AOTInductor package installed here (warm installs only a verified "
            "package of this code: see its aot status)",
        )
    from ..runtime import load_package
    from .model import make_inputs

    inputs = make_inputs(req.model, req.shapes, req.base_path, req.device)
    steps.enter("load package")
    start = time.perf_counter()
    model = load_package(req.aot_in)
    loaded = time.perf_counter() - start
    steps.enter("package first call")
    with torch.no_grad():
        inputs.call(model)
    first = time.perf_counter() - start
    return Response(
        ok=True,
        compile_seconds=first,
        call_seconds=[first],
        import_seconds=imports,
        counters={},
        torch=torch.__version__,
        aot={
            "load_seconds": loaded,
            "first_call_seconds": first,
            "inductor_imported": "torch._inductor" in sys.modules,
        },
    )


def verify(req: Request) -> Response:
    """``aot``: load the package the parent restored, make the first call, compare."""
    import torch

    from ..runtime import load_package
    from .calls import entry
    from .model import build_recorded
    from .parity import Outputs, check_parity, load_reference, vs_eager
    from .protocol import Response
    from .task import check_precision, parity_tolerance, under_autocast
    from .tf32 import accuracy_settings, bakes_tf32
    from .timing import first_call

    assert req.parity is not None and req.aot_in is not None
    check_precision(req.device, req.precision)
    model, inputs, deps = build_recorded(req.model, req.shapes, req.base_path, req.device)
    tol = parity_tolerance(req.parity.model_dump(), req.precision)
    steps.enter("load package")
    start = time.perf_counter()
    package = load_package(req.aot_in)
    loaded = time.perf_counter() - start
    baked = bakes_tf32(req.mode, req.model.options)
    with torch.no_grad(), accuracy_settings(req.device, baked):
        out, seconds = first_call(package, inputs, req.device, "package first call")
        cand = Outputs.of(out)
    steps.enter("parity")
    eager = under_autocast(entry(model, req.model.call), req.device, req.precision)
    vs, _ = vs_eager(cand, eager, model, inputs, req.model.call, req.device, tol, baked)
    parity = {"vs_eager": vs}
    if req.reference_in:
        ref, ref_64 = load_reference(req.reference_in)
        parity["vs_reference"] = check_parity(cand, ref, ref_64, tol)
    failed = [k for k, v in parity.items() if not v.get("passed")]
    reason = None
    if failed:
        detail = parity[failed[0]].get("detail") or parity[failed[0]].get("method")
        reason = f"the package's outputs differ {failed[0].replace('_', ' ')}: {detail}"
    return Response(
        ok=True,
        compile_seconds=loaded + seconds,
        package_parity=parity,
        torch=torch.__version__,
        deps=deps,
        aot={
            "verified": not failed,
            "reason": reason,
            "load_seconds": loaded,
            "first_call_seconds": loaded + seconds,
        },
    )
