"""``verify``: in this fresh process, load the package the parent restored the way a
deploy loads it (its worker half: :meth:`gatekeeper.worker.kinds.PackageHalf.loading`),
make the first call, and compare its outputs with eager's and with the reference
outputs of the check that asked (the parity ladder). Verified only when the package
loaded as a package and every comparison passed: what ``check`` must see before
``warm`` may serve it to a deploy."""

from __future__ import annotations

from pathlib import Path

import torch

from ..boundary import breadcrumbs
from ..boundary.protocol import Response, VerifyRequest
from .calls import entry
from .kinds import Built, package_half
from .model import build_recorded
from .parity import Outputs, check_parity, read_reference, vs_eager
from .precision import check_precision, parity_tolerance, under_autocast
from .tf32 import accuracy_settings, bakes_tf32
from .timing import first_call


def verify(req: VerifyRequest) -> Response:
    if req.task == "generate":
        return _generation(req)
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
    return _verdict(req, parity, seconds, deps, loaded.fields, loaded.failed, loaded.counters)


def _verdict(
    req: VerifyRequest,
    parity: dict,
    seconds: float,
    deps: dict,
    fields: dict,
    failed: str | None = None,
    counters: dict | None = None,
) -> Response:
    """The package's verdict: verified when it loaded as a package (``failed``: why not)
    and every comparison passed."""
    differ = [k for k, v in parity.items() if not v.get("passed")]
    reason = failed
    if reason is None and differ:
        detail = parity[differ[0]].get("detail") or parity[differ[0]].get("method")
        reason = f"the package's outputs differ {differ[0].replace('_', ' ')}: {detail}"
    return Response(
        ok=True,
        compile_seconds=seconds,
        counters=counters,
        package_parity=parity,
        torch=torch.__version__,
        deps=deps,
        packages={
            req.package.name: {
                **fields,
                "verified": reason is None,
                "reason": reason,
                "first_call_seconds": seconds,
            }
        },
    )


def _generation(req: VerifyRequest) -> Response:
    """A generate target's package: generations on it in this fresh process, loaded as
    a deploy loads it, on the check's two prompts; their tokens compared with eager's
    and with the check's own (:mod:`gatekeeper.worker.generate_parity`)."""
    from .generate import loop_of
    from .generate_parity import Generated, check
    from .model import make_inputs

    check_precision(req.device, req.precision)
    model, inputs, deps = build_recorded(
        req.model, req.shapes, req.base_path, req.device, req.quantize
    )
    other = make_inputs(req.model, req.shapes, req.base_path, req.device, seed=req.model.seed + 1)
    tol = parity_tolerance(req.parity, req.precision)
    loop = loop_of(model, req, inputs, load=Path(req.package.path))
    loop.compile()  # the package loaded
    built = loop.built or Built()
    fields = {k: (built.package or {}).get(k) for k in ("load_seconds", "weights")}
    breadcrumbs.enter("package first call")
    first = loop.run(inputs, scores=True)
    cand = Generated.of([first, loop.run(other, scores=True)])
    breadcrumbs.enter("parity")
    eager = Generated.of([loop.run(p, compiled=False, scores=True) for p in (inputs, other)])
    parity = {"vs_eager": check(cand, eager, tol, ("the package", "eager"))}
    if req.reference_in and (reference := read_reference(req.reference_in)) is not None:
        if (stored := Generated.read(reference[0])) is not None:
            parity["vs_reference"] = check(cand, stored, tol, ("the package", "the check"))
    seconds = (fields["load_seconds"] or 0.0) + first.e2e
    return _verdict(req, parity, seconds, deps, fields)
