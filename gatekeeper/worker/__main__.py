"""The worker process: ``python -m gatekeeper.worker REQUEST.json RESPONSE.json``.

Started by :mod:`gatekeeper.boundary.client` with a fresh, isolated inductor cache dir.
It always writes a response: ``ok`` true with the action's fields, or ``ok`` false with
``fault`` (``config``: the user's factory or inputs; ``compile``: torch failed) and a
one-line ``error``: torch's message and where in the model's code it happened. Killed
by a signal, it cannot: the step it was in (:mod:`gatekeeper.boundary.breadcrumbs`) and
faulthandler's stack in its log tell the parent where.
"""

from __future__ import annotations

import faulthandler
import os
import re
import sys
import traceback
from pathlib import Path

from .. import safefs
from ..boundary import breadcrumbs
from ..boundary.protocol import (
    REQUEST,
    DepsRequest,
    MeasureRequest,
    ProbeRequest,
    Request,
    Response,
    VerifyRequest,
)
from ..errors import ConfigError, first_line


def handle(req: Request) -> Response:
    """The request's action, after the imports every worker makes ahead
    (:mod:`gatekeeper.worker.imports`) but for a probe, which times them itself."""
    if not isinstance(req, ProbeRequest):
        from .imports import check_isa, preload

        preload()
        if req.device == "cpu" and not isinstance(req, DepsRequest):
            check_isa()
    if isinstance(req, ProbeRequest) and req.load is not None and not req.eager:
        from .kinds import package_half

        if (answer := package_half(req.load).probe(req)) is not None:
            return answer
    if req.task == "infer":  # what the kind adds to the model's calls (aot: no KV cache)
        from .kinds import builder
        from .model import CALL_KWARGS

        CALL_KWARGS.update(builder(req).call_kwargs)
    if isinstance(req, MeasureRequest) and req.task == "generate":
        from .generate_measure import measure_generate

        return measure_generate(req)
    if isinstance(req, MeasureRequest):
        from .measure import measure

        return measure(req)
    if isinstance(req, VerifyRequest):
        from .verify import verify

        return verify(req)
    if isinstance(req, ProbeRequest):
        from .compile import probe

        return probe(req)
    if isinstance(req, DepsRequest):
        from .compile import deps

        return deps(req)
    from .compile import compile_target

    return compile_target(req)


_USER_CODE = re.compile(r'File "([^"]+)", line (\d+)')


def _shown(path: str, base_dir: Path) -> str:
    """A source file as a person finds it: relative to the config's folder, else from
    its package (``transformers/models/llama/modeling_llama.py``), else as it is."""
    path = os.path.abspath(path)
    try:
        return Path(path).relative_to(base_dir.resolve()).as_posix()
    except ValueError:
        pass
    for marker in ("site-packages", "dist-packages"):
        if f"{os.sep}{marker}{os.sep}" in path:
            return path.split(f"{os.sep}{marker}{os.sep}", 1)[1]
    return path


def where(e: BaseException, base_dir: Path) -> str | None:
    """The model code's ``file:line`` where ``e`` happened: the last frame of the user
    code torch names (Dynamo: "from user code:"), else the innermost traceback frame
    outside torch, gatekeeper and Python's own library."""
    text = str(e)
    if "from user code:" in text:
        found = _USER_CODE.findall(text.split("from user code:", 1)[1])
        if found:
            return f"{_shown(found[-1][0], base_dir)}:{found[-1][1]}"
    from .deps import is_stdlib

    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    torch_dir = os.sep + "torch" + os.sep
    best = None
    for frame, line in traceback.walk_tb(e.__traceback__):
        path = os.path.abspath(frame.f_code.co_filename)
        if path.startswith(ours) or torch_dir in path or not os.path.isfile(path):
            continue
        if is_stdlib(path):
            continue
        best = f"{_shown(path, base_dir)}:{line}"
    return best


def describe(e: BaseException, base_dir: Path) -> str:
    """One line: torch's message (``Type: first line``) and the model code's file:line."""
    at = where(e, base_dir)
    return first_line(e) + (f" (at {at})" if at else "")


def out_of_memory(e: BaseException) -> bool:
    """Python's MemoryError, torch's OutOfMemoryError (a GPU's), or the CPU allocator's
    refusal (a RuntimeError from ``alloc_cpu``)."""
    torch = sys.modules.get("torch")
    if isinstance(e, MemoryError) or (torch and isinstance(e, torch.OutOfMemoryError)):
        return True
    return isinstance(e, RuntimeError) and "can't allocate memory" in str(e)


def failed(e: Exception, base_dir: Path) -> Response:
    """The response for what the work raised: a target the plan refused
    (:mod:`gatekeeper.worker.plan`), an out-of-memory naming the step it happened in,
    else the model's own failure and where."""
    if type(e).__name__ == "WontFit":
        return Response.failure("memory", str(e))
    if out_of_memory(e):
        return Response.failure(
            "compile",
            f"out of memory in {breadcrumbs.current() or 'the worker'}: {first_line(e, 300)}",
        )
    return Response.failure("compile", describe(e, base_dir))


def main(argv: list[str]) -> int:
    request_path, response_path = Path(argv[0]), Path(argv[1])
    # a worker killed by a signal leaves its step (and, from faulthandler, the Python
    # stack that crashed) for the parent: see gatekeeper.boundary.breadcrumbs
    breadcrumbs.begin(response_path)
    faulthandler.enable(all_threads=False)
    req = REQUEST.validate_json(request_path.read_text())
    team = None
    try:
        if req.model.distributed is not None:  # one rank of several (worker.team)
            from ..boundary.ranks import backend_of
            from . import team as teams

            breadcrumbs.enter("join the process group")
            team = teams.join(req, backend_of(req))
            req = teams.localize(req, team)
        resp = handle(req)
        if team is not None:
            resp = teams.finish(req, team, resp)
            if resp.ok:
                from .parity import gather_references

                gather_references(getattr(req, "reference_out", None))
    except ConfigError as e:
        resp = Response.failure("config", str(e))
    except Exception as e:  # the model's own failure: report it, let other targets run
        traceback.print_exc(file=sys.stderr)
        resp = failed(e, req.base_path)
    if resp.facts is None and req.model.distributed is None:
        from .model import FACTS

        resp.facts = FACTS or None
    # a new file renamed over the name: whatever model code left there is replaced
    safefs.write_new(response_path, resp.model_dump_json())
    if req.model.distributed is None:
        return 0
    if not resp.ok:  # the agent stops the other ranks at once, not at their timeout
        sys.stderr.flush()
        os._exit(1)
    from .team import leave

    leave()
    return 0


if __name__ == "__main__":
    from . import end

    end(main(sys.argv[1:]))
