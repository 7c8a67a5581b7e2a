"""``gatekeeper warm``: restore verified bundles into the inductor cache dir."""

from __future__ import annotations

from ..errors import EXIT_FAILED, EXIT_OK
from ..github.announce import announce_warm
from ..progress import Progress
from ..runtime import default_cache_dir
from ..warm import cold, probe, service_env, settle, warm_targets
from ..worker.protocol import dynamo_skipped
from .common import Context, human_bytes, output_dir

HELP = "restore each target's bundle into the inductor cache dir a deploy will use"


def register(sub, parents) -> None:
    p = sub.add_parser("warm", help=HELP, description=HELP, parents=parents)
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="inductor cache dir to fill (default: $TORCHINDUCTOR_CACHE_DIR, else torch's default)",
    )
    p.add_argument("--strict", action="store_true", help="exit 1 when any target is a miss")
    p.add_argument(
        "--probe",
        action="store_true",
        help="then run each target's first compiled call in a fresh process "
        "on the warmed cache and report its time and cache hits (a hit "
        "whose FX graphs all miss is reported as stale)",
    )


def run(ctx: Context) -> int:
    ctx.signing_key()  # a signature required without a key: exit 2 before any work
    cache_dir = (
        output_dir(ctx.args.cache_dir, "--cache-dir").absolute() if ctx.args.cache_dir else None
    )
    targets = ctx.targets  # a config error is an error; the store is best effort
    try:
        store_uri = ctx.store.uri
    except Exception as e:  # an unopenable store is a miss, never a crash
        store_uri = ctx.args.store or ctx.config.store
        results = cold(targets, e)
    else:
        results = warm_targets(targets, ctx.config, ctx.store, cache_dir)
    cache = cache_dir or default_cache_dir()
    docs = [r.as_dict() for r in results]
    env = service_env(results)  # what the service needs (the probe runs with it too)
    if ctx.args.probe:
        progress = Progress(len(results))
        for target, doc in zip(ctx.targets, docs, strict=True):
            with progress.step(target.id, "first compiled call") as step:
                served = doc.get("precompile") == "served"
                resp = probe(target, ctx.config, cache, verbose=ctx.args.verbose, env=env)
                if target.strategy == "aot" and resp.ok and resp.aot:
                    # the package gatekeeper.load_aot serves, in a fresh process
                    doc["first_call_seconds"] = resp.compile_seconds
                    doc["import_torch_seconds"] = resp.import_seconds
                    if doc.get("cold_compile_seconds") and resp.compile_seconds:
                        doc["speedup"] = doc["cold_compile_seconds"] / resp.compile_seconds
                    doc["dynamo"] = "skipped"
                    doc["inductor_imported"] = resp.aot.get("inductor_imported")
                    step.done(
                        f"{resp.compile_seconds:.2f} s (import torch "
                        f"{resp.import_seconds or 0:.2f} s apart), AOTInductor package"
                    )
                elif resp.ok and resp.compile_seconds is not None and resp.counters:
                    c = resp.counters
                    doc["first_call_seconds"] = resp.compile_seconds
                    # the calls after it: a CUDA-graph mode records (captures) on one
                    doc["call_seconds"] = resp.call_seconds
                    if doc.get("cold_compile_seconds"):
                        doc["speedup"] = doc["cold_compile_seconds"] / resp.compile_seconds
                    doc["fxgraph_cache_hit"] = c["fxgraph_cache_hit"]
                    doc["fxgraph_cache_miss"] = c["fxgraph_cache_miss"]
                    # a training step's backward and optimizer come through AOTAutograd
                    doc["autograd_cache_hit"] = c.get("autograd_cache_hit", 0)
                    doc["autograd_cache_miss"] = c.get("autograd_cache_miss", 0)
                    doc["status"] = settle(doc["status"], c)  # a hit whose graphs all miss
                    # did the first call run Dynamo? (only a loaded package skips it)
                    doc["dynamo"] = "skipped" if dynamo_skipped(c) else "traced"
                    if served and doc["dynamo"] == "traced":
                        doc["precompile_reason"] = (
                            "the package did not load: the first "
                            "call ran Dynamo (a guard or source "
                            "check failed; it recompiled)"
                        )
                    step.done(
                        f"{resp.compile_seconds:.2f} s, dynamo {doc['dynamo']}"
                        + (", stale: every FX graph missed" if doc["status"] == "stale" else "")
                    )
                else:
                    doc["probe_error"] = resp.error
                    step.done(f"error: {resp.error}")
    hits = sum(d["status"] == "hit" for d in docs)
    packages = sum(d.get("precompile") == "served" for d in docs)
    held = [d for d in docs if d.get("precompile") == "installed"]
    footer = f"{hits}/{len(results)} hit, cache dir {cache}"
    if held:
        footer += (
            f"; {len(held)} verified precompile package(s) installed but "
            f"{held[0]['precompile_reason']}"
        )
    if packages:
        # the settings a separate service process needs to load them
        settings = " ".join(f"{k}={v}" for k, v in env.items())
        footer += (
            f"; {packages} verified precompile package(s) installed: start the "
            f"service with {settings} (or call gatekeeper.warm_start() in it) so "
            "that its torch.compile skips Dynamo"
        )
    announce_warm([d["status"] for d in docs])
    ctx.emit(
        {
            "command": "warm",
            "store": store_uri,
            "cache_dir": str(cache),
            **({"service_env": env} if env else {}),
            "targets": docs,
        },
        [{**d, "size": human_bytes(d.get("bundle_bytes"))} for d in docs],
        {
            "target": "target",
            "status": "status",
            "cold_compile_seconds": "cold compile s",
            "first_call_seconds": "warm first call s",
            "speedup": "speedup",
            "size": "bundle",
            "fxgraph_cache_hit": "fx hits",
            "precompile": "precompile",
            "aot": "aot",
            "dynamo": "dynamo",
            "reason": "reason",
        },
        footer=footer,
    )
    if ctx.args.strict and any(r.status == "miss" for r in results):
        return EXIT_FAILED
    return EXIT_OK
