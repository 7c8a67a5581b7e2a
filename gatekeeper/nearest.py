"""Why a target missed: the store's nearest bundle for it, and every fact that differs.

A miss (no bundle for this target and env key) used to say only that. The bundles the
store holds for the target under any env key are read here (manifests only, each
verified as :func:`gatekeeper.key.find_bundle` verifies them; one that does not is
skipped), and each is compared with this machine's key fact by fact: the env facts
(torch build, Python, CPU capability and ISA flags, threads, GPU, CUDA, the compile
environment variables), the compile spec, the factories, and the code it was built from
(each module, file and distribution its manifest recorded, re-checked here). The
nearest is the one with the fewest differences (the newest among equals).
``gatekeeper warm`` carries it on a miss (``nearest`` in ``--json``, a line in its
reason) and ``gatekeeper key --explain`` prints it.
"""

from __future__ import annotations

import logging
from typing import Any

from . import bundle
from .errors import AccessDenied, StoreUnavailable
from .key import CacheKey, resolve_deps, valid_deps
from .store.layout import Store

log = logging.getLogger("gatekeeper.nearest")

MAX_SAID = 6  # differences named in a one-line reason (the JSON has them all)


def _flat(env: dict) -> dict[str, Any]:
    """Env facts, the compile environment's variables each a fact of its own."""
    out = {k: v for k, v in env.items() if k != "compile_env"}
    out.update({f"compile_env.{k}": v for k, v in (env.get("compile_env") or {}).items()})
    return out


def _short(value: Any) -> Any:
    """A content hash as its first 12 digits; anything else as it is."""
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]
    return value


def _compare(kind: str, bundle_side: dict, here: dict) -> list[dict[str, Any]]:
    return [
        {
            "fact": f"{kind}{name}",
            "bundle": _short(bundle_side.get(name)),
            "here": _short(here.get(name)),
        }
        for name in sorted(set(bundle_side) | set(here), key=str)
        if bundle_side.get(name) != here.get(name)
    ]


def differences(recorded: dict, key: CacheKey, memo: dict[str, str | None]) -> list[dict]:
    """Every fact in which a bundle's recorded key (its manifest's ``key``) differs
    from ``key`` on this machine and checkout: ``{"fact", "bundle", "here"}`` each
    (None: the side has no such fact; a module gone here is ``here: None``)."""
    out = _compare("", _flat(recorded.get("env") or {}), _flat(key.env))
    out += _compare("spec.", recorded.get("spec") or {}, key.spec)
    if recorded.get("refs") != key.refs:
        out.append({"fact": "factories", "bundle": recorded.get("refs"), "here": key.refs})
    deps = recorded.get("deps")
    if deps is None or not valid_deps(deps):
        return out + [{"fact": "dependencies", "bundle": None, "here": "recorded"}]
    current = resolve_deps(deps, key.base_dir, memo)
    for kind, what in (("modules", "module "), ("files", "file "), ("distributions", "dist ")):
        recorded_kind = deps.get(kind) or {}
        now = {name: (current.get(kind) or {}).get(name) for name in recorded_kind}
        out += _compare(what, recorded_kind, now)
    for name in deps.get("absent") or []:
        if name not in (current.get("absent") or []):
            out.append({"fact": f"module {name}", "bundle": "absent", "here": "importable"})
    return out


def nearest(store: Store, key: CacheKey, *, signing_key: bytes | None) -> dict | None:
    """The store's bundle of ``key``'s target nearest to ``key`` (fewest differing
    facts, then newest), as ``{"bundle", "env_key", "code_hash", "differs"}``; None
    when the store holds none that verifies. Best effort: a store that cannot be read
    gives None."""
    best: tuple[int, dict] | None = None
    memo: dict[str, str | None] = {}
    try:
        locations = store.target_manifests(key.target_id)
    except (StoreUnavailable, AccessDenied, OSError) as e:
        log.debug("nearest bundle of %s: %s", key.target_id, e)
        return None
    for loc in locations:  # newest first: among equals the first stays
        try:
            data = store.read_manifest(loc)
            if data is None:
                continue
            manifest = bundle.verify_manifest(data, target=key.target_id, signing_key=signing_key)
            differs = differences(manifest.key, key, memo)
        except Exception as e:  # one bad manifest is skipped, as find_bundle skips it
            log.debug("nearest bundle of %s: %s skipped: %s", key.target_id, loc.prefix, e)
            continue
        if best is None or len(differs) < best[0]:
            doc = {
                "bundle": loc.prefix,
                "env_key": loc.env_key,
                "code_hash": loc.code_hash,
                "differs": differs,
            }
            best = (len(differs), doc)
    return best[1] if best else None


def says(near: dict | None) -> str:
    """The nearest bundle in one line: where it is and what differs."""
    if near is None:
        return "the store holds no bundle of this target under any environment"
    facts = [f"{d['fact']} {d['bundle']} (here {d['here']})" for d in near["differs"]]
    more = len(facts) - MAX_SAID
    shown = "; ".join(facts[:MAX_SAID]) + (f"; and {more} more" if more > 0 else "")
    return (
        f"nearest bundle {near['bundle']} differs in: {shown or 'nothing (an unreadable archive?)'}"
    )
