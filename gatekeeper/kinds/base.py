"""The two interfaces an artifact kind implements, parent side (no torch here).

A :class:`Kind` is a way to compile and ship a target: a value of a model's
``strategies`` (``whole``, ``regional``, ``aot``). A :class:`Package` is an artifact a
bundle carries beside the cache dir, or instead of it, that a deploy may load only once
a ``check`` verified it (``precompile``, the ``aot`` kind's AOTInductor package).

Modelled on asv's benchmark types and pytest's hooks: every method has a default that
fits most kinds, and a kind overrides what it does differently. Each is a singleton,
found by name through :mod:`gatekeeper.kinds`. The worker's half of a kind (how it
builds the model, loads its package) lives in the module its ``worker`` attribute names
(``"module:attribute"``), imported only inside the worker, so the parent never imports
torch for a kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from .. import units
from ..config import DEFAULT_STRATEGY

if TYPE_CHECKING:
    from ..boundary.breadcrumbs import Death
    from ..boundary.protocol import Response
    from ..config import Config, ModelConfig
    from ..targets import Target
    from ..warmed import WarmResult

DEFAULT = DEFAULT_STRATEGY  # a model that names no strategies gets it; ids and keys omit it


@dataclass(frozen=True)
class Launch:
    """How a target's worker runs: one process (``ranks`` 1, ``launcher`` None), or
    ``ranks`` processes started by torch's elastic agent from a launcher process
    (``launcher``: the module run as ``python -m``, :mod:`gatekeeper.boundary.elastic`).

    A model with ``distributed`` set runs as its world size's ranks
    (:meth:`Kind.launch`); :func:`gatekeeper.boundary.client.run_worker` starts them,
    each rank answers for itself and the parent reads one merged answer
    (:mod:`gatekeeper.boundary.merge`): the slowest rank's latency per round, every
    rank's cache files (shared where all ranks used a file, per rank where not)."""

    ranks: int = 1
    launcher: str | None = None


class Kind:
    """A way to compile and ship a target. Subclass it, set the class attributes, and
    override the methods whose defaults do not fit; register an instance
    (:func:`gatekeeper.kinds.register`, or the ``gatekeeper.kinds`` entry point)."""

    name: ClassVar[str]  # the value in ``strategies`` and the id's ``+name``
    # its worker half, "module:attribute" (gatekeeper.worker.kinds.Builder)
    worker: ClassVar[str]
    title: ClassVar[str] = ""  # how the report names it, when not by its name
    # ModelConfig fields only this kind reads: set without it in ``strategies``, they are
    # a config error; they are part of its targets' definition only
    owns: ClassVar[tuple[str, ...]] = ()
    # the package a deploy loads instead of compiling (the bundle then carries no cache
    # dir, a compile is never seeded, the shape sweep does not apply)
    package: ClassVar[Package | None] = None
    # the add-on packages its bundles may carry (``precompile``), and for the others why
    # not (said in the manifest and the results)
    carries: ClassVar[tuple[str, ...]] = ()
    refusals: ClassVar[dict[str, str]] = {}
    # whether a model with ``distributed`` set may have targets of this kind
    distributable: ClassVar[bool] = False
    # the precompiled C++ headers its CPU workers build beyond the JIT kernels', which
    # the header worker builds once per machine and lends them (gatekeeper.worker.headers
    # parts: "aoti")
    headers: ClassVar[tuple[str, ...]] = ()

    # -- config and targets ---------------------------------------------------------
    def check_model(self, model: ModelConfig) -> str | None:
        """Why ``model`` cannot be compiled this way (a config error), None if it can."""
        return None

    # what :meth:`applies` admits, as a config error names it
    scope: ClassVar[str] = "inference targets"

    def applies(self, model: ModelConfig, task: str, precision: str) -> bool:
        """Whether the model's (task, precision) gets a target of this kind (default:
        inference only: a training step is compiled whole)."""
        return task == "infer"

    def spec(self, model: ModelConfig) -> dict[str, Any]:
        """What this kind adds to a target's compile spec, so its key differs from the
        other kinds' (the default kind adds nothing: existing keys stay valid)."""
        return {"strategy": self.name}

    # -- the worker -----------------------------------------------------------------
    def launch(self, model: ModelConfig) -> Launch:
        """How the worker that builds a target of this kind of ``model`` runs: its
        world size's ranks when it is ``distributed``, else one process."""
        if model.distributed is None:
            return Launch()
        return Launch(model.distributed.world_size, "gatekeeper.boundary.elastic")

    def died(self, death: Death, device: str) -> str | None:
        """A worker of this kind killed by a signal: the one line of an ``unavailable``
        target when the death is this kind's own on this machine (None: an error)."""
        return None

    def __repr__(self) -> str:
        return f"<kind {self.name}>"


Serve = str  # "verified" (a deploy), "any" (the check that verifies), "never" (a measurement)


@dataclass
class Warming:
    """One package of one bundle being restored (what :meth:`Package.warm` works on)."""

    result: WarmResult
    manifest: Any  # the verified gatekeeper.bundle.Manifest
    hit: bool  # the bundle is this code's
    staging: Path  # the verified, extracted archive
    cache_dir: Path
    serve: Serve
    claimed: set[str]  # cache-dir paths packages installed so far in this warm
    stage: Path | None = None  # a check's: where to put the package it measures or verifies
    target_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Package:
    """An artifact a bundle carries that a deploy loads only once a ``check`` verified
    it. Its manifest section is ``compile.<name>``; ``verified`` there is null until a
    check loaded it in a fresh worker and compared its outputs (one generic verifier,
    :mod:`gatekeeper.check.verify`)."""

    name: ClassVar[str]  # the manifest's compile.<name>, and results' and warm's field
    title: ClassVar[str]  # how messages name it ("AOTInductor", "precompile")
    worker: ClassVar[str]  # its worker half (gatekeeper.worker.kinds.PackageHalf)
    ready: ClassVar[str]  # compile.<name>.status of a package the bundle has
    standalone: ClassVar[bool] = False  # a deploy loads it instead of compiling
    # what the verification's verdict records besides "verified"
    verdict_fields: ClassVar[tuple[str, ...]] = ("reason", "first_call_seconds")
    serve_when_verifying: ClassVar[Serve] = "never"  # how the verifier restores the bundle
    serving: ClassVar[str] = ""  # the advice's word when it recommends this kind for serving

    # -- compile --------------------------------------------------------------------
    def wanted(self, target: Target, config: Config) -> bool:
        """Whether a compile of ``target`` records this package's section at all."""
        return True

    def refusal(self, target: Target) -> str | None:
        """Why ``target`` cannot have one (None: the compile builds it)."""
        return None

    def out(self, tmp: Path) -> Path:
        """Where the compile's worker writes it, inside the compile's scratch dir."""
        return tmp / self.name

    def pack(
        self, target: Target, resp: Response, out: Path | None, cache_dir: Path
    ) -> tuple[dict[str, Any], dict[str, Path]]:
        """Its manifest section and its archive members (name -> file) from what the
        compile's worker answered (``resp.packages[name]``; ``out`` None: it was not
        asked to build one, :meth:`refusal` says why)."""
        raise NotImplementedError

    # -- warm -----------------------------------------------------------------------
    def info(self, manifest: Any) -> dict[str, Any]:
        """What the bundle's compile said of it (``{}``: none)."""
        found = manifest.compile.get(self.name)
        return found if isinstance(found, dict) else {}

    def present(self, manifest: Any) -> bool:
        """Whether the bundle has anything of it (its section or its members)."""
        return bool(self.info(manifest))

    def warm(self, w: Warming) -> None:
        """Install it from a verified bundle, or say in ``w.result`` why not."""
        raise NotImplementedError

    def settle(self, result: WarmResult, cache_dir: Path, serve: Serve) -> None:
        """After a target's warm, found or not (a deploy must not keep another
        version's package)."""

    def finish(self, results: list[WarmResult], cache_dir: Path, claimed: set[str]) -> None:
        """After every target of a warm."""

    def service_env(self, results: list[WarmResult]) -> dict[str, str]:
        """What a service process needs in its environment to load what warm served."""
        return {}

    def warm_note(self, results: list[WarmResult], env: dict[str, str]) -> str:
        """What ``gatekeeper warm`` adds to its last line about it (``"; ..."``)."""
        return ""

    def in_process(self, env: dict[str, str]) -> None:
        """``warm_start()``: make this process load what warm served (``env``: the
        service environment every package asked for)."""

    def probe_load(self, target_id: str, cache_dir: Path, env: dict[str, str]) -> Path | None:
        """``warm --probe``: what the probing worker loads of it as a deploy would
        (``env``: the service environment warm asked for; None: nothing)."""
        return None

    def probed(self, result: WarmResult, dynamo: str) -> None:
        """What the probe's first compiled call (``dynamo``: ``skipped`` or ``traced``)
        says of a package warm served."""

    # -- check ----------------------------------------------------------------------
    def staged(self, result: WarmResult, stage: Path, cache_dir: Path) -> Path | None:
        """What a check's worker loads of it, once warm restored the bundle into
        ``cache_dir`` with ``stage`` given (None: nothing there after all)."""
        raise NotImplementedError

    def verify_env(self, result: WarmResult) -> dict[str, str]:
        """The verifying worker's extra environment (a deploy's that serves it)."""
        return {}

    # -- report ---------------------------------------------------------------------
    def detail(self, doc: dict[str, Any]) -> tuple[str, str | None] | None:
        """Its line in a target's details, from the results' document: what the report
        says after ``**<title> package:**``, and the reason (None: no line)."""
        return verdict_line(doc)

    def __repr__(self) -> str:
        return f"<package {self.name}>"


def verdict_line(doc: dict[str, Any]) -> tuple[str, str | None]:
    """A package's verdict as the report says it: ``verified``, ``rejected`` or ``not
    verified``, with the first call's seconds, and the reason."""
    verified = doc.get("verified")
    said = "verified" if verified is True else "rejected" if verified is False else "not verified"
    first = doc.get("first_call_seconds")
    if isinstance(first, (int, float)):
        said += f", first call {units.seconds(first)} in a new process"
    return said, doc.get("reason")


def deploy_gate(info: dict, hit: bool) -> tuple[str, str] | None:
    """Why a deploy may not serve a bundle's package (``info``: its compile section):
    (status, reason); None when it may: this code's bundle, verified by a check. One
    rule for every package, not a member a package could loosen."""
    if not hit:
        return "unverified", "the bundle is another version's: its package is not served"
    if info.get("verified") is not True:
        check = info.get("check") or {}
        status = "rejected" if info.get("verified") is False else "unverified"
        return status, check.get("reason") or "no check has verified it yet"
    return None
