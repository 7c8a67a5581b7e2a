"""Artifact kinds: the one place that knows what kinds there are.

Every kind, gatekeeper's own and a third party's alike, is known by reference
(``"module:attribute"``, an instance of :class:`~gatekeeper.kinds.base.Kind` or
:class:`~gatekeeper.kinds.base.Package`) and imported on first use:

* gatekeeper's own: :data:`BUILTIN` (``whole``, ``regional``, ``aot``; the ``precompile``
  package);
* installed ones: the entry points of group ``gatekeeper.kinds`` (in a distribution's
  ``pyproject.toml``: ``[project.entry-points."gatekeeper.kinds"] nograd =
  "mypkg.nograd:NOGRAD"``);
* in-process ones: :func:`register`.

Everything else asks here (:func:`get`, :func:`of`, :func:`packages_of`) and never
compares a kind's name itself (``tests/test_structure.py``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
from typing import TYPE_CHECKING

from .base import DEFAULT, Kind, Launch, Package, Warming

if TYPE_CHECKING:
    from ..config import Config, ModelConfig
    from ..targets import Target

__all__ = [
    "DEFAULT",
    "Kind",
    "Launch",
    "Package",
    "Warming",
    "applying",
    "check",
    "foreign",
    "get",
    "names",
    "of",
    "package",
    "package_names",
    "packages",
    "packages_of",
    "register",
]

log = logging.getLogger("gatekeeper.kinds")

GROUP = "gatekeeper.kinds"  # the entry point group of installed kinds
BUILTIN = (
    "gatekeeper.kinds.whole:WHOLE",
    "gatekeeper.kinds.regional:REGIONAL",
    "gatekeeper.kinds.precompile:PRECOMPILE",
    "gatekeeper.kinds.aot:AOT",
)

_kinds: dict[str, Kind] = {}
_packages: dict[str, Package] = {}
_loaded = False


def load(ref: str) -> object:
    """The object a ``"module:attribute"`` reference names, imported now."""
    module, _, attr = ref.partition(":")
    obj: object = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj


def register(item: Kind | Package) -> None:
    """Make a kind (with its own package) or a package known in this process, after
    gatekeeper's own and the installed ones."""
    _discover()
    if isinstance(item, Kind):
        _kinds[item.name] = item
        if item.package is not None:
            _packages.setdefault(item.package.name, item.package)
    else:
        _packages[item.name] = item


def _add(found: object, ref: str) -> None:
    if not isinstance(found, (Kind, Package)):
        raise TypeError(f"{ref} is neither a gatekeeper Kind nor a Package")
    register(found)


def _discover() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for ref in BUILTIN:
        _add(load(ref), ref)
    for ep in importlib.metadata.entry_points(group=GROUP):
        try:
            _add(ep.load(), ep.value)
        except Exception as e:  # a broken plugin must not take gatekeeper down with it
            log.warning("kind %s (%s) not loaded: %s: %s", ep.name, ep.value, type(e).__name__, e)


def names() -> list[str]:
    """Every kind a model's ``strategies`` may name, gatekeeper's own first."""
    _discover()
    return list(_kinds)


def package_names() -> list[str]:
    _discover()
    return list(_packages)


def get(name: str) -> Kind:
    """The kind called ``name`` (KeyError when there is none: the config validates
    ``strategies`` against :func:`names` first)."""
    _discover()
    return _kinds[name]


def of(target: Target) -> Kind:
    """The kind of ``target``."""
    return get(target.strategy)


def of_id(target_id: str) -> Kind:
    """The kind of a target id (its variant's last ``+`` part, else the default)."""
    last = target_id.rsplit("/", 1)[-1].rsplit("+", 1)
    return get(last[1]) if len(last) == 2 and last[1] in names() else get(DEFAULT)


def check(model: ModelConfig) -> str | None:
    """Why ``model``'s ``strategies`` cannot be (a config error), None when they can:
    a field a kind owns set without that kind, what a kind asks of the model, and a
    training-only model with a kind that compiles inference only."""
    _discover()
    for kind in _kinds.values():
        for field in kind.owns:
            if getattr(model, field) is not None and kind.name not in model.strategies:
                return (
                    f"'{field}' is set but 'strategies' has no \"{kind.name}\" "
                    f'(add it: strategies = ["{DEFAULT}", "{kind.name}"])'
                )
    for name in model.strategies:
        if why := _kinds[name].check_model(model):
            return why
        if model.distributed is not None and not _kinds[name].distributable:
            return (
                f"'strategies': a distributed model is compiled {DEFAULT} in each rank; "
                f'"{name}" does not run as ranks (drop it, or drop distributed)'
            )
    if "infer" not in model.tasks:  # a training step, a generation: not every kind
        other = [
            s
            for s in model.strategies
            if not any(_kinds[s].applies(model, t, "fp32") for t in model.tasks)
        ]
        if other:
            task = "train" if "train" in model.tasks else "generate"
            what = "a training step" if task == "train" else "a generation"
            ways = " or ".join(n for n, k in _kinds.items() if k.applies(model, task, "fp32"))
            scopes = "; ".join(f"{s} applies to {_kinds[s].scope} only" for s in other)
            return (
                f"'strategies': {what} is compiled {ways}; {scopes} "
                '(add "infer" to tasks, or drop it)'
            )
    return None


def applying(model: ModelConfig, task: str, precision: str) -> list[str]:
    """The model's strategies that apply to its (task, precision), else the default."""
    _discover()
    found = [s for s in model.strategies if _kinds[s].applies(model, task, precision)]
    return found or [DEFAULT]


def foreign(name: str) -> set[str]:
    """The ModelConfig fields the other kinds own (not part of a ``name`` target)."""
    _discover()
    return {f for k in _kinds.values() if k.name != name for f in k.owns}


def package(name: str) -> Package:
    _discover()
    return _packages[name]


def packages() -> list[Package]:
    """Every package a bundle may carry."""
    _discover()
    return list(_packages.values())


def packages_of(target: Target, config: Config) -> list[Package]:
    """The packages a compile of ``target`` records: its kind's own, then the add-on
    packages the config asks for (each says why not when the target cannot have one)."""
    kind = of(target)
    own = [kind.package] if kind.package is not None else []
    return own + [p for p in packages() if not p.standalone and p.wanted(target, config)]


def ships_cache(kind: Kind) -> bool:
    """Whether ``kind``'s bundles carry the compile's cache dir, a compile starts from
    the previous bundle's and ``check`` sweeps the model's other shape sets: not when a
    deploy loads its package instead (it serves the shapes it was built for)."""
    return kind.package is None or not kind.package.standalone


def refuses(kind: Kind, package: str) -> str | None:
    """Why a target of ``kind`` carries no ``package`` (None: it may)."""
    if package in kind.carries:
        return None
    return kind.refusals.get(package, f"a {kind.name} target carries no {package} package")


def target_id(kind: Kind, target: str) -> str:
    """A target id of ``kind``, from one given with or without its ``+name``."""
    suffix = "" if kind.name == DEFAULT else f"+{kind.name}"
    return target if target.endswith(suffix) else f"{target}{suffix}"


def label(kind: Kind, mode: str) -> str:
    """``default``, ``default+regional``: a mode and ``kind``, as the report names a row."""
    return mode if kind.name == DEFAULT else f"{mode}+{kind.name}"
