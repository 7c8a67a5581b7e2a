"""``gatekeeper key``: print each target's cache key and every fact it is made of.

The code hash covers what the model is really built from, which only building it tells
(see :mod:`gatekeeper.key`), so this runs a worker that builds each model and its inputs
once (a few seconds: torch is imported, nothing is compiled). That way the key is
known before any compile, and two machines can compare theirs.
"""

from __future__ import annotations

from pathlib import Path

from .. import kinds
from ..boundary.client import run_or_fail
from ..boundary.protocol import DepsRequest
from ..errors import EXIT_OK, ConfigError, WorkerError
from ..key import CacheKey, target_key
from ..scratch import scratch_dir
from .common import Context

HELP = "print each target's cache key and its components (why did a runner miss?)"


def register(sub, parents) -> None:
    p = sub.add_parser("key", help=HELP, description=HELP, parents=parents)
    p.add_argument(
        "--explain",
        action="store_true",
        help="also look each target up in the store: hit, or why not (the nearest "
        "bundle and every fact that differs)",
    )


def _explain(ctx: Context, key: CacheKey) -> dict:
    """What the store holds for ``key``: ``hit``, ``partial`` (and why), or ``miss``
    with the nearest bundle (:mod:`gatekeeper.nearest`)."""
    from ..key import find_bundle
    from ..nearest import nearest, says

    signing = ctx.signing_key()
    match, reason = find_bundle(ctx.store, key, signing_key=signing)
    if match is not None and match.status == "hit":
        return {"status": "hit", "bundle": match.location.prefix}
    near = nearest(ctx.store, key, signing_key=signing)
    why = match.why if match is not None else reason
    return {
        "status": match.status if match is not None else "miss",
        "reason": f"{why}; {says(near)}",
        "nearest": near,
    }


def _keys(ctx: Context) -> list[CacheKey]:
    """Every target's key, its dependencies recorded by one worker build per model and
    shape set (mode and dynamic do not change what the model is built from)."""
    keys = []
    built: dict[tuple, dict] = {}
    for t in ctx.targets:
        key = target_key(t, ctx.config.base_dir)
        which = (t.model.name, tuple(sorted(t.shape_set.items())))
        if which not in built:
            with scratch_dir("gk-key-") as tmp:
                resp = run_or_fail(
                    DepsRequest.of(t, ctx.config, key.device, kind=kinds.of(t)),
                    cache_dir=Path(tmp, "cache"),
                    timeout=ctx.config.measure.timeout,
                    verbose=ctx.args.verbose,
                    label=t.id,
                )
            if not resp.ok or resp.deps is None:
                raise (ConfigError if resp.fault == "config" else WorkerError)(
                    f"{t.id}: building the model failed: {resp.error}"
                )
            built[which] = resp.deps
        keys.append(key.with_deps(built[which]))
    return keys


def run(ctx: Context) -> int:
    keys = _keys(ctx)
    found = {k.target_id: _explain(ctx, k) for k in keys} if ctx.args.explain else {}
    if ctx.args.json:
        docs = [k.as_dict() | ({"store": found[k.target_id]} if found else {}) for k in keys]
        ctx.emit({"command": "key", "targets": docs})
        return EXIT_OK
    for k in keys:
        print(f"{k.target_id}")
        if k.target_id in found:
            _print_found(found[k.target_id])
        print(f"  env key    {k.env_key}")
        print(f"  code hash  {k.code_hash}")
        print(f"  bundle     bundles/{k.target_id}/{k.env_key}/{k.code_hash}/")
        for name, value in k.env.items():
            print(f"  env.{name:<15} {value}")
        for name, value in k.spec.items():
            print(f"  spec.{name:<14} {value}")
        for ref in k.refs:
            print(f"  factory {ref}")
        deps = k.deps or {}
        for name, digest in deps.get("modules", {}).items():
            print(f"  module {name}  {digest[:16]}")
        for path, digest in deps.get("files", {}).items():
            print(f"  file {path}  {digest[:16]}")
        for name, version in deps.get("distributions", {}).items():
            print(f"  distribution {name} {version}")
        for name in deps.get("absent", []):
            print(f"  absent {name} (not importable)")
    return EXIT_OK


def _print_found(found: dict) -> None:
    print(f"  store      {found['status']}" + (f": {found['bundle']}" if "bundle" in found else ""))
    near = found.get("nearest")
    if near is None:
        if found["status"] != "hit":
            print(f"  why        {found['reason']}")
        return
    print(f"  nearest    {near['bundle']}")
    for d in near["differs"]:
        print(f"  differs    {d['fact']}: bundle {d['bundle']}, here {d['here']}")
