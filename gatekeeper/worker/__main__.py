"""The worker process: ``python -m gatekeeper.worker REQUEST.json RESPONSE.json``.

Started by :mod:`gatekeeper.worker.launch` with a fresh, isolated inductor cache dir.
It always writes a response: ``ok`` true with the action's fields, or ``ok`` false with
``kind`` (``config``: the user's factory or inputs; ``compile``: torch failed) and a
one-line ``error``.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from ..errors import ConfigError, first_line
from .protocol import Request, Response


def handle(req: Request) -> Response:
    if req.action == "probe" and req.strategy == "aot" and not req.eager:
        from .aot import probe  # imports torch itself, timed, and never inductor

        return probe(req)
    if req.action == "aot":
        from .aot import verify

        return verify(req)
    if req.action == "measure":
        from .measure import measure

        return measure(req)
    if req.action == "precompile":
        from .precompile import verify

        return verify(req)
    from .compile import compile_target

    return compile_target(req)


def main(argv: list[str]) -> int:
    request_path, response_path = Path(argv[0]), Path(argv[1])
    req = Request.model_validate_json(request_path.read_text())
    try:
        resp = handle(req)
    except ConfigError as e:
        resp = Response.failure("config", str(e))
    except Exception as e:  # the model's own failure: report it, let other targets run
        traceback.print_exc(file=sys.stderr)
        resp = Response.failure("compile", first_line(e))
    response_path.write_text(resp.model_dump_json())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
