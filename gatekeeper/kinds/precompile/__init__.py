"""``precompile``: torch's caching-precompile package of a compiled model (Dynamo's own,
recorded by the worker's half, :mod:`gatekeeper.kinds.precompile.worker`), carried by a
``whole`` float32 inference target's bundle when the config's ``precompile`` is
``auto``. A deploy that loads it skips Dynamo and AOTAutograd in ``torch.compile``.

Members: ``precompile/...``, what recording the package added to a copy of the compile's
cache dir (``dynamo/<key>/entry`` and its AOT/FX entries). ``warm`` installs them into
the cache dir only when the bundle is an exact ``hit`` and a ``check`` verified the
package; otherwise the plain cache is installed and any package a previous warm left
at the same place is removed, so the deploy can never load one that was not verified.
Packages load in a process only with ``TORCH_CACHING_PRECOMPILE=1``, all or nothing:
:meth:`Precompile.service_env`.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import bundle
from ...runtime import ISA_ENV, PRECOMPILE_ENV
from .. import of_id
from ..base import Package, Warming, deploy_gate

if TYPE_CHECKING:
    from ...boundary.protocol import Response
    from ...config import Config
    from ...targets import Target
    from ...warmed import WarmResult

log = logging.getLogger("gatekeeper.warm")

PREFIX = "precompile/"


def entries(manifest: Any) -> set[str]:
    """The ``dynamo/<key>`` folders the bundle's package would install."""
    return {
        "/".join(name.split("/")[1:3])
        for name in manifest.files
        if name.startswith(PREFIX + "dynamo/") and name.count("/") >= 3
    }


class Precompile(Package):
    name = "precompile"
    title = "precompile"
    worker = "gatekeeper.kinds.precompile.worker:PACKAGE"
    ready = "recorded"
    verdict_fields = ("dynamo", "reason", "first_call_seconds")
    serve_when_verifying = "any"

    # -- compile --------------------------------------------------------------------
    def wanted(self, target: Target, config: Config) -> bool:
        return config.precompile_for(target.model)

    def refusal(self, target: Target) -> str | None:
        """Why torch (2.13) cannot give ``target`` a package that loads."""
        if target.task == "generate":
            return (
                "a generation warms from the compile cache: its prefill and decode are "
                "calls of one compiled forward that transformers' generate() makes"
            )
        if target.task != "infer":
            return (
                "a training step cannot be packaged (torch bypasses packaging for the "
                "optimizer step's graph)"
            )
        if target.precision != "fp32":
            # measured: the package loads, and its guards fail on every call under autocast
            return (
                "a package recorded under autocast never loads (torch records its input "
                "guards without the Autocast dispatch key, so every call misses them)"
            )
        if target.quantized:
            return (
                "a quantized target warms from the compile cache: loading a package of "
                "torchao's tensor subclasses is not verified"
            )
        if target.model.distributed is not None:
            return (
                "a distributed target's ranks warm from the compile cache: a package "
                "is recorded per process, and no rank may skip Dynamo while another traces"
            )
        from .. import of, refuses

        return refuses(of(target), self.name)

    def pack(
        self, target: Target, resp: Response, out: Path | None, cache_dir: Path
    ) -> tuple[dict[str, Any], dict[str, Path]]:
        """``verified`` stays null until a ``check`` has loaded it and compared."""
        if reason := self.refusal(target):
            return {"status": "unavailable", "reason": reason}, {}
        recorded = resp.packages.get(self.name)
        if out is None or not recorded or recorded.get("status") != self.ready:
            reason = (recorded or {}).get("reason") or "the worker recorded no package"
            return {"status": "unavailable", "reason": reason}, {}
        files = bundle.changed_files(cache_dir, out)
        section = {**recorded, "files": len(files), "verified": None}
        return section, {PREFIX + rel: path for rel, path in files.items()}

    # -- warm -----------------------------------------------------------------------
    def present(self, manifest: Any) -> bool:
        return bool(self.info(manifest)) or bool(entries(manifest))

    def warm(self, w: Warming) -> None:
        found = entries(w.manifest)
        serve = self._serves(w, found)
        if not serve:  # never leave a package of another version where torch looks
            for entry in found - w.claimed:
                shutil.rmtree(w.cache_dir / entry, ignore_errors=True)
            return
        w.result.files += bundle.install_tree(w.staging / PREFIX.rstrip("/"), w.cache_dir)
        w.claimed |= found

    def _serves(self, w: Warming, found: set[str]) -> bool:
        """Whether to install the package (its ``dynamo/<key>`` folders ``found``);
        says why in the result."""
        info, state = self.info(w.manifest), w.result.package(self.name)
        if not found:
            if info:
                state.status, state.reason = info.get("status"), info.get("reason")
            return False
        if w.serve == "never":
            return False
        if w.serve == "verified" and (refused := deploy_gate(info, w.hit)):
            state.status, state.reason = refused
            return False
        if taken := found & w.claimed:
            state.status = "shadowed"
            state.reason = (
                f"another target's package already serves {sorted(taken)[0]} in this cache dir"
            )
            return False
        state.status = "served"
        return True

    def finish(self, results: list[WarmResult], cache_dir: Path, claimed: set[str]) -> None:
        hold(results, stuck=drop_unserved(cache_dir, claimed))

    def service_env(self, results: list[WarmResult]) -> dict[str, str]:
        """All or nothing: only when every target warm found is served from its own
        verified package, ``TORCH_CACHING_PRECOMPILE=1`` (torch loads packages inside
        ``torch.compile``) and ``TORCHINDUCTOR_VEC_ISA_OK=1`` (no ISA probe: the key
        pins the CPU's flags and a package's kernels are built). Either setting costs a
        target without a package its warm start (the first changes AOTAutograd's keys,
        the second is in the FX graph key), and torch would hand a ``shadowed`` target
        the package of another target of its model; :func:`hold` says so on the served
        ones."""
        served = any(r.package(self.name).status == "served" for r in results)
        if served and _unpackaged(results) is None:
            return {PRECOMPILE_ENV: "1", ISA_ENV: "1"}
        return {}

    def warm_note(self, results: list[WarmResult], env: dict[str, str]) -> str:
        states = [r.package(self.name) for r in results]
        held = [s for s in states if s.status == "installed"]
        served = sum(s.status == "served" for s in states)
        note = ""
        if held:
            note += f"; {len(held)} verified precompile package(s) installed but {held[0].reason}"
        if served:  # the settings a separate service process needs to load them
            settings = " ".join(f"{k}={v}" for k, v in env.items())
            note += (
                f"; {served} verified precompile package(s) installed: start the "
                f"service with {settings} (or call gatekeeper.warm_start() in it) so "
                "that its torch.compile skips Dynamo"
            )
        return note

    def in_process(self, env: dict[str, str]) -> None:
        if env.get(PRECOMPILE_ENV) != "1":
            return
        from ...runtime import enable_precompile_loading

        try:  # this process loads the verified packages its torch.compile calls find
            enable_precompile_loading(skip_isa_probe=ISA_ENV in env)
        except Exception as e:  # best effort: a normal warm start
            log.warning("precompile packages not enabled: %s: %s", type(e).__name__, e)

    def probe_load(self, target_id: str, cache_dir: Path, env: dict[str, str]) -> Path | None:
        """Packages load in the probe where the service loads them."""
        return cache_dir if env.get(PRECOMPILE_ENV) == "1" else None

    def probed(self, result: WarmResult, dynamo: str) -> None:
        state = result.package(self.name)
        if state.status == "served" and dynamo == "traced":
            state.reason = (
                "the package did not load: the first call ran Dynamo (a guard or source "
                "check failed; it recompiled)"
            )

    # -- check ----------------------------------------------------------------------
    def staged(self, result: WarmResult, stage: Path, cache_dir: Path) -> Path | None:
        """Served into the worker's cache dir (where torch finds it)."""
        return cache_dir if result.package(self.name).status == "served" else None

    def verify_env(self, result: WarmResult) -> dict[str, str]:
        return self.service_env([result])  # the environment of a deploy that serves it

    # -- report ---------------------------------------------------------------------
    def detail(self, doc: dict[str, Any]) -> tuple[str, str | None] | None:
        """None: ``warm`` says what became of it (results.json keeps the verdict)."""
        return None


PRECOMPILE = Precompile()


def drop_unserved(cache_dir: Path, claimed: set[str]) -> str | None:
    """Remove every precompile package (``dynamo/<key>``) in ``cache_dir`` that this
    warm did not serve: one an earlier deploy left for a target that now misses, or
    that is no longer warmed, must not load (torch finds a package by the forward's
    name, not by the code it was verified for). Returns the first one that could not
    be removed, None when none is left."""
    root = cache_dir / "dynamo"
    try:
        found = [p for p in root.iterdir()] if root.is_dir() else []
    except OSError:
        return str(root)
    for entry in found:
        name = f"dynamo/{entry.name}"
        if name in claimed:
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError as e:
            log.warning("cannot remove the stale precompile package %s: %s", entry, e)
            return name
    return None


def _unpackaged(results: list[WarmResult]) -> WarmResult | None:
    """The first target warmed (found or missed) that is not served from a package of
    its own; None when every one is. A miss counts: that target compiles cold, and
    turning packages on would let torch load whatever package it finds for it. A found
    target whose kind deploys a package of its own never runs torch.compile: the
    setting cannot cost it anything."""
    for r in results:
        if r.package(PRECOMPILE.name).status == "served":
            continue
        own = of_id(r.target).package
        if own is not None and own.standalone and r.status in ("hit", "partial"):
            continue
        return r
    return None


def hold(results: list[WarmResult], *, stuck: str | None = None) -> None:
    """When :meth:`Precompile.service_env` turns packages off, say why on each installed
    one. ``stuck``: a package this warm did not serve that could not be removed (then
    no package may load: torch would find that one too)."""
    held = _unpackaged(results)
    if held is None and stuck is None:
        return
    for r in results:
        state = r.package(PRECOMPILE.name)
        if state.status != "served":
            continue
        state.status = "installed"
        if held is None:
            state.reason = (
                f"not loaded: the stale package {stuck} in this cache dir could not be removed"
            )
            continue
        why = (
            f"missed ({held.reason or 'no bundle'})"
            if held.status == "miss"
            else f"has no package of its own ({held.package(PRECOMPILE.name).status or 'none'})"
        )
        state.reason = (
            f"not loaded: {held.target} is warmed too and {why}; turning packages on "
            "would cost it its cache hits (warm it for a service of its own to load "
            "this one)"
        )
