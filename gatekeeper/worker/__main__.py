"""The subprocess that compiles (and later measures) one target.

Run as ``python -m gatekeeper.worker REQUEST.json RESPONSE.json`` by
:mod:`gatekeeper.isolate`, with a fresh, isolated inductor cache dir, so that a cold
compile is really cold and torch's counters describe this target alone. It always writes
a response: ``{"ok": true, ...}`` or ``{"ok": false, "kind": "config"|"compile",
"error": "<one line>"}``.
"""
from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.utils import counters

from .config import ModelConfig
from .errors import ConfigError
from .model import build_model, make_inputs


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def compile_model(model: torch.nn.Module, cfg: ModelConfig, mode: str, dynamic: bool):
    kwargs: dict[str, Any] = {"backend": cfg.backend, "fullgraph": cfg.fullgraph,
                              "dynamic": dynamic}
    if cfg.options:
        kwargs["options"] = cfg.options
    elif mode != "default":
        kwargs["mode"] = mode
    return torch.compile(model, **kwargs)


def snapshot_counters() -> dict[str, Any]:
    """The torch counters that say what the compile did (cache hits, graphs, breaks)."""
    inductor = dict(counters["inductor"])
    aot = dict(counters["aot_autograd"])
    return {
        "fxgraph_cache_hit": inductor.get("fxgraph_cache_hit", 0),
        "fxgraph_cache_miss": inductor.get("fxgraph_cache_miss", 0),
        "fxgraph_cache_bypass": inductor.get("fxgraph_cache_bypass", 0),
        "autograd_cache_hit": aot.get("autograd_cache_hit", 0),
        "autograd_cache_miss": aot.get("autograd_cache_miss", 0),
        "graphs": counters["stats"].get("unique_graphs", 0),
        "graph_breaks": sum(counters["graph_break"].values()),
        "frames": counters["frames"].get("ok", 0),
    }


def do_compile(req: dict) -> dict:
    cfg = ModelConfig.model_validate(req["model"])
    base_dir, device = Path(req["base_dir"]), req["device"]
    model = build_model(cfg, base_dir, device)
    inputs = make_inputs(cfg, req["shapes"], base_dir, device)
    megacache_load = None
    if req.get("load_megacache"):  # PyTorch's documented recipe, for comparison
        start = time.perf_counter()
        torch.compiler.load_cache_artifacts(Path(req["load_megacache"]).read_bytes())
        megacache_load = time.perf_counter() - start
    compiled = compile_model(model, cfg, req["mode"], req["dynamic"])
    calls = []
    with torch.no_grad():
        for _ in range(3):  # cudagraph trees record on a later call; run until settled
            start = time.perf_counter()
            compiled(*inputs)
            _sync(device)
            calls.append(time.perf_counter() - start)
    megacache = None
    if req.get("megacache"):
        megacache = torch.compiler.save_cache_artifacts()
        if megacache is not None:
            Path(req["megacache"]).write_bytes(megacache[0])
    return {"ok": True, "compile_seconds": calls[0], "call_seconds": calls,
            "counters": snapshot_counters(), "megacache": megacache is not None,
            "megacache_load_seconds": megacache_load,
            "torch": torch.__version__}


# "probe" is a compile against whatever cache dir the parent gave, saving nothing: the
# first call's time and cache counters show whether a warm start really was warm.
def do_measure(req: dict) -> dict:
    from .measure import measure

    return measure(req, compile_model, snapshot_counters)


ACTIONS = {"compile": do_compile, "probe": do_compile, "measure": do_measure}


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    line = f"{type(e).__name__}: {line}" if line else type(e).__name__
    return line[:400]


def main(argv: list[str]) -> int:
    request_path, response_path = Path(argv[0]), Path(argv[1])
    req = json.loads(request_path.read_text())
    try:
        resp = ACTIONS[req["action"]](req)
    except ConfigError as e:
        resp = {"ok": False, "kind": "config", "error": str(e)}
    except Exception as e:  # the model's own failure: report it, let other targets run
        traceback.print_exc(file=sys.stderr)
        resp = {"ok": False, "kind": "compile", "error": _first_line(e)}
    response_path.write_text(json.dumps(resp))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
