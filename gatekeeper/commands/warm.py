"""``gatekeeper warm``: restore verified bundles into the inductor cache dir."""

from __future__ import annotations

from pathlib import Path

from .. import kinds
from ..errors import EXIT_FAILED, EXIT_OK
from ..github.announce import announce_warm
from ..progress import Progress
from ..runtime import default_cache_dir, resolve_device
from ..warm import WarmResult, cold, lend_headers, probe, service_env, warm_targets
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
    env = service_env(results)  # what the service needs (the probe runs with it too)
    if ctx.args.probe:
        progress = Progress(len(results))
        for target, result in zip(ctx.targets, results, strict=True):
            with progress.step(target.id, "first compiled call") as step:
                result.probe = probe(
                    target, ctx.config, cache, result, verbose=ctx.args.verbose, env=env
                )
                step.done(result.probe.note)
    # the service's first call then builds no C++ header (a CPU's kernels include one)
    on_cpu = any(resolve_device(t.model.device) == "cpu" for t in targets)
    lend_headers(results, build=on_cpu)
    docs = [r.as_dict() for r in results]
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
            # a generate target's probe: its first generation's first token
            **(
                {"first_token_seconds": "first token s"}
                if any(d.get("first_token_seconds") is not None for d in docs)
                else {}
            ),
            "speedup": "speedup",
            "size": "bundle",
            "fxgraph_cache_hit": "fx hits",
            **{p.name: p.name for p in kinds.packages()},
            "dynamo": "dynamo",
            "reason": "reason",
        },
        footer=_footer(results, cache, env),
    )
    if ctx.args.strict and any(r.status == "miss" for r in results):
        return EXIT_FAILED
    return EXIT_OK


def _footer(results: list[WarmResult], cache: Path, env: dict[str, str]) -> str:
    """How many hit, and what each package says (what a separate service needs)."""
    hits = sum(r.status == "hit" for r in results)
    return f"{hits}/{len(results)} hit, cache dir {cache}" + "".join(
        package.warm_note(results, env) for package in kinds.packages()
    )
