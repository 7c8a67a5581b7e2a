"""``aot``: ``torch.export``, then an AOTInductor package (``aoti_compile_and_package``):
a ``.pt2`` a deploy loads with :func:`gatekeeper.load_aot`, without Dynamo, inductor or
the model's Python code. Float32 inference targets (the package runs its own kernels,
which a caller's autocast cannot change), and generations of ``generate()`` on a
static cache, in their weights' dtype (:mod:`gatekeeper.kinds.aot.worker_generate`:
the cache's forward exported; the prefill and each decode step are calls of one
package);
``export = { strict = ... }`` says how torch.export runs. The worker's half:
:mod:`gatekeeper.kinds.aot.worker` (the package's: :mod:`gatekeeper.kinds.aot.worker_package`),
imported only in the worker.

The package is the artifact: the bundle carries it (``aot/model.pt2``) and no cache
dir, and ``warm`` installs it for a deploy (under ``gatekeeper/aot/<target>/`` in the
inductor cache dir, :func:`gatekeeper.runtime.package_dir`) only when the bundle is this
code's and a ``check`` verified it; otherwise any package an earlier warm left there is
removed. A model that does not export is ``not-exportable``; a worker that torch's
AOTInductor kills on this machine makes the target ``unavailable``. A package built
without its weights (``export.weights``) says so in its document (``weights``:
``bound``); its size (``bytes``) is reported with the weights' (``weight_bytes``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import safefs, units
from ...runtime import AOT_MEMBER, INFO, MANIFEST, PACKAGE, package_dir
from ..base import Kind, Package, Serve, Warming, deploy_gate

if TYPE_CHECKING:
    from ...boundary.breadcrumbs import Death
    from ...boundary.protocol import Response
    from ...config import ModelConfig
    from ...targets import Target
    from ...warmed import WarmResult

# the worker's steps inside torch's AOTInductor: a signal there is torch's package failing
# on this machine (or native code the package calls), so the target is `unavailable`
STEPS = frozenset(
    {"aoti_compile_and_package", "load package", "package first call", "base package first call"}
)


class AotPackage(Package):
    name = "aot"
    title = "AOTInductor"
    worker = "gatekeeper.kinds.aot.worker_package:PACKAGE"
    ready = "packaged"
    standalone = True
    verdict_fields = ("reason", "first_call_seconds", "load_seconds", "weights")
    serving = (
        "its AOTInductor package exported and verified, so a deploy loads it with "
        "gatekeeper.load_aot, without Dynamo or inductor"
    )

    def out(self, tmp: Path) -> Path:
        return tmp / PACKAGE

    def pack(
        self, target: Target, resp: Response, out: Path | None, cache_dir: Path
    ) -> tuple[dict[str, Any], dict[str, Path]]:
        assert out is not None  # an aot target always builds its package
        built = resp.packages.get(self.name) or {}
        doc = {
            "status": self.ready,
            "export": resp.export,
            "bytes": out.stat().st_size,
            "weights": built.get("weights"),  # "bound": load_aot(..., model=...) binds them
            "weight_bytes": built.get("weight_bytes"),
        }
        return {**doc, "verified": None}, {AOT_MEMBER: out}

    def warm(self, w: Warming) -> None:
        package = w.staging / AOT_MEMBER
        if w.stage is not None and package.is_file():  # a check measures or verifies it
            w.stage.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(package, w.stage / PACKAGE)
        if w.serve == "verified":
            self._install(w.result, w.manifest, w.hit, package, w.cache_dir)

    def _install(
        self, result: WarmResult, manifest: Any, hit: bool, package: Path, cache_dir: Path
    ) -> None:
        """A deploy's package: installed where :func:`gatekeeper.load_aot` finds it when
        the bundle is this code's (``hit``) and a check verified the package; otherwise
        any package an earlier warm left there is removed, so a service never loads one
        that was not verified for this code."""
        dest = package_dir(cache_dir, result.target)
        info = self.info(manifest)
        state = result.package(self.name)
        refused = deploy_gate(info, hit)
        if not package.is_file():
            state.status, state.reason = "missing", info.get("reason") or "the bundle has none"
        elif refused is not None:
            state.status, state.reason = refused
        else:
            # a worker may have written this cache dir (warm's probe): its folders are
            # walked, and its files written, never through a link (gatekeeper.safefs)
            fd = safefs.folder_fd(cache_dir, dest.relative_to(cache_dir))
            try:
                with contextlib.suppress(FileNotFoundError):  # no verdict beside another one
                    os.unlink(INFO, dir_fd=fd)
                safefs.copy_new(package, package.name, dir_fd=fd)
                doc = {
                    "target": result.target,
                    "code_hash": manifest.code_hash,
                    "env_key": manifest.env_key,
                    "sha256": manifest.files[AOT_MEMBER].sha256,
                    "verified": True,
                    "check": info.get("check") or {},
                }
                with safefs.new_file(MANIFEST, dir_fd=fd) as f:  # its signature, for load_aot
                    f.write(manifest.to_bytes())
                with safefs.new_file(INFO, dir_fd=fd) as f:
                    f.write((json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())
            finally:
                os.close(fd)
            state.status = "served"
            return
        shutil.rmtree(dest, ignore_errors=True)

    def settle(self, result: WarmResult, cache_dir: Path, serve: Serve) -> None:
        if serve == "verified" and result.package(self.name).status is None:
            # no bundle (or a bad one): no package of another version stays installed
            shutil.rmtree(package_dir(cache_dir, result.target), ignore_errors=True)
            result.package(self.name).status = "missing"
            result.package(self.name).reason = "no bundle to serve it from"

    def probe_load(self, target_id: str, cache_dir: Path, env: dict[str, str]) -> Path | None:
        """The package warm installed, loaded as gatekeeper.load_aot does."""
        return package_dir(cache_dir, target_id) / PACKAGE

    def staged(self, result: WarmResult, stage: Path, cache_dir: Path) -> Path | None:
        package = stage / PACKAGE
        return package if package.is_file() else None

    def detail(self, doc: dict[str, Any]) -> tuple[str, str | None] | None:
        verified = doc.get("verified")
        state = "verified" if verified is True else "rejected" if verified is False else None
        first = doc.get("first_call_seconds")
        said = f"{state or 'not verified'}" + (
            f", first call {units.seconds(first)} in a new process" if first else ""
        )
        if isinstance(size := doc.get("bytes"), int):
            weights = doc.get("weight_bytes")
            of = f" ({units.size(weights)})" if isinstance(weights, int) else ""
            said += f"; package {units.size(size)}, " + (
                f"weights{of} bound at load (load_aot(..., model=...))"
                if doc.get("weights") == "bound"
                else f"weights{of} in it"
            )
        if doc.get("note"):
            said += f"; {doc['note']}"
        return said, doc.get("reason")


PACKAGE_KIND = AotPackage()


class Aot(Kind):
    name = "aot"
    title = "AOTInductor"
    worker = "gatekeeper.kinds.aot.worker:AOT"
    owns = ("export",)
    package = PACKAGE_KIND
    refusals = {"precompile": "an aot target ships its own AOTInductor package instead"}
    headers = ("aoti",)  # its package's wrapper and kernel headers, about 20 CPU-s each

    def check_model(self, model: ModelConfig) -> str | None:
        if model.backend != "inductor":
            return (
                f"'strategies': \"aot\" builds an AOTInductor package and needs "
                f'backend = "inductor", not {model.backend!r}'
            )
        return None

    scope = "float32 inference targets and generate() generations on a static cache"

    def applies(self, model: ModelConfig, task: str, precision: str) -> bool:
        if task == "generate":  # transformers' static-cache forward (worker_generate),
            gen = model.generation  # its weights in the precision's dtype (no autocast)
            return gen.prefill is None and gen.cache == "static"
        return task == "infer" and precision == "fp32"

    def spec(self, model: ModelConfig) -> dict[str, Any]:
        return {"strategy": self.name, "export": model.export_settings.model_dump()}

    def died(self, death: Death, device: str) -> str | None:
        if death.signal is None or death.step not in STEPS:
            return None
        torch = f" with torch {death.torch}" if death.torch else ""
        return (
            f"unavailable: torch's AOTInductor killed the worker ({death.signal}) in "
            f"{death.step}{torch} on {device}; the target's other strategies are unaffected"
        )


AOT = Aot()
