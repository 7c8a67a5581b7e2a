"""What warming one target found: :class:`WarmResult`, the record :mod:`gatekeeper.warm`
returns and each kind's package (:class:`gatekeeper.kinds.Package`) reads and writes
while it warms. It sits below both, so neither imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .results import CacheStatus


@dataclass
class PackageState:
    """A package of a warmed bundle: ``served`` (installed for a deploy), ``installed``
    (not loaded: see the precompile kind's ``hold``), ``unverified``, ``rejected``,
    ``shadowed``, ``unavailable``, ``missing``; and why."""

    status: str | None = None
    reason: str | None = None


@dataclass
class WarmResult:
    target: str
    status: CacheStatus  # hit | partial | miss (| stale: a probe saw every graph miss)
    env_key: str | None = None
    code_hash: str | None = None
    bundle_code_hash: str | None = None
    files: int = 0
    seconds: float = 0.0
    cold_compile_seconds: float | None = None  # what the bundle's compile took, cold
    bundle_bytes: int | None = None
    reason: str | None = None
    # a miss: the store's nearest bundle of the target and every fact that differs
    nearest: dict | None = None
    # by package name (warm gives every known package one); read as ``precompile`` /
    # ``precompile_reason`` (``aot``, ...)
    packages: dict[str, PackageState] = field(default_factory=dict)
    probe: Any = None  # what ``warm --probe`` saw (gatekeeper.warm.Probe), not a field
    manifest: Any = field(default=None, repr=False)  # the verified manifest, not output
    location: Any = field(default=None, repr=False)  # where it was found, not output

    def package(self, name: str) -> PackageState:
        return self.packages.setdefault(name, PackageState())

    def __getattr__(self, name: str) -> Any:
        """``r.precompile``, ``r.aot_reason``: a package's status and reason."""
        base = name.removesuffix("_reason")
        state = self.__dict__.get("packages", {}).get(base)
        if name.startswith("__") or state is None:
            raise AttributeError(name)
        return state.reason if base != name else state.status

    def as_dict(self) -> dict:
        out: dict[str, Any] = {}
        for k, v in self.__dict__.items():
            if k == "packages":
                for name, state in v.items():
                    out.update({name: state.status, f"{name}_reason": state.reason})
            elif k == "probe" and v is not None:
                out.update(v.as_dict())  # the probe's figures, besides the warm's
            elif k not in ("manifest", "location"):
                out[k] = v
        return {k: v for k, v in out.items() if v is not None}
