"""The worker's dispatch to the artifact kinds: a request names its kind's worker half
and each package's (``"module:attribute"``), imported here on first use, and only in
the worker. Each kind is one folder and keeps its worker half in it
(``gatekeeper/kinds/<name>/worker.py``), as an installed kind keeps its own in its
package; here are only the dispatch and the ``Builder`` and ``PackageHalf`` interfaces."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from ...kinds import load
from .base import Builder, Built, Job, Loaded, PackageHalf, Refused

if TYPE_CHECKING:
    from ...boundary.protocol import Build, PackageRef

__all__ = [
    "Builder",
    "Built",
    "Job",
    "Loaded",
    "PackageHalf",
    "Refused",
    "builder",
    "package_half",
]


_load = cache(load)


def builder(req: Build) -> Builder:
    """The worker half of ``req``'s kind."""
    found = _load(req.kind.worker)
    if not isinstance(found, Builder):
        raise TypeError(f"{req.kind.worker} is not a gatekeeper.worker.kinds.Builder")
    return found


def package_half(ref: PackageRef) -> PackageHalf:
    """The worker half of the package ``ref`` names."""
    found = _load(ref.worker)
    if not isinstance(found, PackageHalf):
        raise TypeError(f"{ref.worker} is not a gatekeeper.worker.kinds.PackageHalf")
    return found
