"""``gatekeeper key``: print each target's cache key and every fact it is made of."""
from __future__ import annotations

from ..errors import EXIT_OK
from ..key import compute_key
from .common import Context

HELP = "print each target's cache key and its components (why did a runner miss?)"


def register(sub, parents) -> None:
    sub.add_parser("key", help=HELP, description=HELP, parents=parents)


def run(ctx: Context) -> int:
    keys = [compute_key(t, ctx.config.base_dir) for t in ctx.targets]
    if ctx.args.json:
        ctx.emit({"command": "key", "targets": [k.as_dict() for k in keys]})
        return EXIT_OK
    for k in keys:
        print(f"{k.target_id}")
        print(f"  env key    {k.env_key}")
        print(f"  code hash  {k.code_hash}")
        print(f"  bundle     bundles/{k.target_id}/{k.env_key}/{k.code_hash}/")
        for name, value in k.env.items():
            print(f"  env.{name:<15} {value}")
        for name, value in k.spec.items():
            print(f"  spec.{name:<14} {value}")
        for path, digest in k.files.items():
            print(f"  file {path}  {digest[:16]}")
    return EXIT_OK
