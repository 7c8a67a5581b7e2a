"""``verify``: in this fresh process, load the package the parent restored the way a
deploy loads it (its worker half: :meth:`gatekeeper.worker.kinds.PackageHalf.loading`),
make the first call, and compare its outputs with eager's and with the reference
outputs of the check that asked (the parity ladder). Verified only when the package
loaded as a package and every comparison passed: what ``check`` must see before
``warm`` may serve it to a deploy."""

from __future__ import annotations

import torch

from ..boundary import breadcrumbs
from ..boundary.protocol import Response, VerifyRequest
from .calls import entry
from .kinds import package_half
from .model import build_recorded
from .parity import Outputs, check_parity, read_reference, vs_eager
from .precision import check_precision, parity_tolerance, under_autocast
from .tf32 import accuracy_settings, bakes_tf32
from .timing import first_call


def verify(req: VerifyRequest) -> Response:
    half = package_half(req.package)
    check_precision(req.device, req.precision)
    model, inputs, deps = build_recorded(
        req.model, req.shapes, req.base_path, req.device, req.quantize
    )
    tol = parity_tolerance(req.parity, req.precision)
    baked = bakes_tf32(req.mode, req.model.options)
    with half.loading(req, model) as loaded:
        with torch.no_grad(), accuracy_settings(req.device, baked):
            out, seconds = first_call(loaded.fn, inputs, req.device, loaded.step)
            cand = Outputs.of(out)
    seconds += loaded.seconds
    breadcrumbs.enter("parity")
    eager = under_autocast(entry(model, req.model.call), req.device, req.precision)
    vs, _ = vs_eager(cand, eager, model, inputs, req.model.call, req.device, tol, baked)
    parity = {"vs_eager": vs}
    if req.reference_in and (reference := read_reference(req.reference_in)) is not None:
        parity["vs_reference"] = check_parity(cand, reference[0], reference[1], tol)
    failed = [k for k, v in parity.items() if not v.get("passed")]
    reason = loaded.failed
    if reason is None and failed:
        detail = parity[failed[0]].get("detail") or parity[failed[0]].get("method")
        reason = f"the package's outputs differ {failed[0].replace('_', ' ')}: {detail}"
    return Response(
        ok=True,
        compile_seconds=seconds,
        counters=loaded.counters,
        package_parity=parity,
        torch=torch.__version__,
        deps=deps,
        packages={
            req.package.name: {
                **loaded.fields,
                "verified": reason is None,
                "reason": reason,
                "first_call_seconds": seconds,
            }
        },
    )
