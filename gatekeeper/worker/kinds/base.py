"""The worker's half of an artifact kind (torch lives here): how a :class:`Builder`
builds a target's compiled callable, and how a :class:`PackageHalf` records, probes and
loads a package. The parent's half (:mod:`gatekeeper.kinds`) names its worker half by
reference (``"module:attribute"``), and the worker imports it from the request
(:func:`gatekeeper.worker.kinds.builder`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...boundary.protocol import Build, CompileRequest, ProbeRequest, Response, VerifyRequest
    from ..calls import Inputs
    from ..graphs import Traced


class Refused(Exception):
    """The kind cannot build this model (torch.export refused it): ``info`` is the
    result's ``export`` document; the target is ``not-exportable``, not an error."""

    def __init__(self, info: dict) -> None:
        super().__init__(info.get("reason") or "not exportable")
        self.info = info

    def says(self) -> str:
        where = f" at {self.info['file']}:{self.info['line']}" if self.info.get("file") else ""
        return f"not exportable: {self.info.get('reason')}{where}"

    def response(self, deps: dict | None) -> Response:
        """The worker's answer: the target is ``not-exportable`` (``deps``: what its
        model was built from)."""
        import torch

        from ...boundary.protocol import Response

        return Response(
            ok=False,
            fault="export",
            error=self.says(),
            export=self.info,
            deps=deps,
            torch=torch.__version__,
        )


@dataclass
class Job:
    """What a kind's build gets: the model (or function) and its inputs, the request;
    ``keep_eager``: ``model`` must stay eager (compile a copy); ``out``: write the
    kind's package there; ``load``: load that package instead of building one."""

    model: Any
    inputs: Inputs
    req: Build
    keep_eager: bool = False
    out: Path | None = None
    load: Path | None = None
    # where its compile records the graphs it traces (a kind that :attr:`Builder.traces`)
    traced: Traced | None = None


@dataclass
class Built:
    """What a kind's build did besides returning the callable: torch.export's outcome,
    its package's document (built or loaded: ``from``, seconds, bytes), and what to
    check once the compile's first calls ran (raises :class:`~gatekeeper.errors.ConfigError`
    when they compiled less than the config asked) and what to do when the model's
    weights move."""

    export: dict[str, Any] | None = None
    package: dict[str, Any] | None = None
    after_first_calls: Callable[[], None] | None = None
    # to call once the model's weights were copied into new memory (paired placement,
    # gatekeeper.worker.placement.same_placement): a package bound to them binds them again
    moved: Callable[[], None] | None = None


class Builder:
    """A kind's worker half: the target's compiled callable."""

    name: str
    package: str | None = None  # the kind's own package (its build writes or loads it)
    # it compiles before the first call (export, package build): that time is compile
    # time, its kernels were counted where they were built (none in this process), and
    # its first call is its package's
    ahead_of_time = False
    # keyword arguments every call of the model gets where its forward takes them and
    # its inputs do not give them (:data:`gatekeeper.worker.model.CALL_KWARGS`)
    call_kwargs: dict[str, Any] = {}
    # its compile traces the model as ``explain`` would and records that trace through
    # :attr:`Job.traced` (then :meth:`graphs` is not called: no second trace)
    traces = False

    @property
    def first_step(self) -> str:
        """The worker's step name of the compiled callable's first call."""
        return "package first call" if self.ahead_of_time else "first call"

    def compiled(self, job: Job) -> tuple[Callable[..., Any], Built]:
        """The compiled callable of the job's model (its ``call`` method or the
        function). Raises :class:`Refused` when the kind cannot build the model."""
        raise NotImplementedError

    def graphs(self, model: Any, req: Build, inputs: Inputs, context: Callable[[], Any]) -> dict:
        """What it compiles, explained: graphs, breaks and their reasons (``context``:
        the precision's autocast)."""
        from ..calls import entry
        from ..graphs import graph_breaks

        return graph_breaks(entry(model, req.model.call), inputs, req.base_path, context=context)

    def generation(self, job: Job, kwargs: dict[str, Any]) -> tuple[Any, Built] | None:
        """A generate target of this kind: a model whose ``generate()`` runs what this
        kind compiles (``torch.compile``'s ``kwargs``; regional: a copy whose blocks are
        compiled, around which the loop runs eager; aot: a generation on its package,
        built into ``job.out`` or loaded from ``job.load``), and what its build did
        (:attr:`Built.after_first_calls`: checked after the first generation); None
        (the default, whole): the loop compiles its own entry points, the model's
        ``forward`` or its prefill and decode functions. Raises :class:`Refused` when
        the kind cannot build the model's generation."""
        return None

    def refused_base(self, model: Any, inputs: Inputs, req: Build) -> dict[str, Any]:
        """Paired, when the head's model was refused: what the base commit's model
        says (merged into the ``export`` document)."""
        return {}


@dataclass
class Loaded:
    """A package loaded for its verification: what the first call calls, the seconds
    before it that count (the load, or ``torch.compile``'s wrap), the first call's step,
    and, once it ran, why it did not load as a package (None: it did), the verdict's
    fields of its own, and torch's counters."""

    fn: Callable[..., Any]
    seconds: float
    step: str = "first call"
    failed: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, int] | None = None


class PackageHalf:
    """A package's worker half."""

    name: str

    def record(self, req: CompileRequest, out: Path) -> dict[str, Any]:
        """An add-on package: record it into ``out`` after the compile; its manifest
        section (``status`` and what it holds, or why not)."""
        raise NotImplementedError

    def probe(self, req: ProbeRequest) -> Response | None:
        """``warm --probe`` of a deploy that loads it: the whole answer, or None when the
        ordinary compiled first call answers (this sets loading up for it)."""
        return None

    @contextmanager
    def loading(self, req: VerifyRequest, model: Any) -> Iterator[Loaded]:
        """Load the package for its verification; the first call runs inside."""
        raise NotImplementedError
        yield
