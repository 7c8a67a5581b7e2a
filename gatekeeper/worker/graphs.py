"""Graphs and graph breaks of a model, with each break's reason and the user's file:line."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from .calls import Inputs


def graph_breaks(
    model: Callable,
    inputs: Inputs,
    base_dir: Path,
    *,
    grad: bool = False,
    context: Callable[[], AbstractContextManager] = contextlib.nullcontext,
) -> dict:
    """Graph count and breaks (``torch._dynamo.explain``: a trace of its own; it resets
    dynamo, so explain every model before compiling anything). ``grad``: with autograd
    on (a training step); ``context``: entered around the call (autocast). Where the
    compile's own trace can say it, :class:`Traced` does without the second trace."""
    with torch.set_grad_enabled(grad), context():
        explained = inputs.call(torch._dynamo.explain(model))
    return _described(explained, base_dir)


class Traced:
    """The graphs a compile traces, recorded as it traces them: torch's
    ``ExplainWithBackend`` around the backend ``torch.compile`` would have built (the
    same wrapper, mode and options, so the same graphs, kernels and cache keys), which
    gives what ``explain`` gives from the same trace (issue 52: no second trace per
    side). :meth:`compile_kwargs` wraps a compile's arguments; :meth:`graphs` reads what
    the calls so far traced."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self._explain: Any = None

    @classmethod
    def of(cls, kwargs: dict[str, Any], base_dir: Path) -> Traced | None:
        """A recorder for a compile of these ``torch.compile`` arguments
        (what :func:`~gatekeeper.worker.compiler.compile_kwargs` returns), or None where it cannot
        record (:meth:`wraps`): then the caller explains before anything compiles."""
        return cls(base_dir) if cls.wraps(kwargs) else None

    @staticmethod
    def wraps(kwargs: dict[str, Any]) -> bool:
        """Can a compile of these ``torch.compile`` arguments record its trace? Not with a
        backend given as a callable, nor options torch.compile itself takes out: then
        the model is explained apart, before anything compiles."""
        backend, options = kwargs["backend"], kwargs.get("options")
        return isinstance(backend, str) and not (options and _COMPILE_ONLY & set(options))

    def compile_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """``torch.compile``'s keyword arguments with the backend wrapped (None where
        :meth:`wraps` says it cannot be)."""
        if not self.wraps(kwargs):
            return None
        from torch._dynamo.backends.debugging import ExplainWithBackend

        backend, options = kwargs["backend"], kwargs.get("options")
        mode = kwargs.get("mode") or (None if options else "default")
        dynamic = kwargs.get("dynamic")
        if backend == "inductor":
            inner: Any = torch._TorchCompileInductorWrapper(mode, options, dynamic)
        else:
            inner = torch._TorchCompileWrapper(backend, mode, options, dynamic)
        self._explain = ExplainWithBackend(inner)
        rest = {k: v for k, v in kwargs.items() if k not in ("backend", "mode", "options")}
        return {**rest, "backend": self._explain}

    def graphs(self) -> dict:
        """Graphs and breaks the compiled calls traced so far, read once, after the
        first call (later recompiles count as recompiles). The graphs are let go then,
        as explain's are once it returns: nothing of them is held through the rounds."""
        assert self._explain is not None, "compile_kwargs() was not used"
        described = _described(self._explain.output(), self.base_dir)
        self._explain.graphs.clear()
        self._explain.break_reasons.clear()
        return described


# options torch.compile pops before it builds the backend
_COMPILE_ONLY = {"guard_filter_fn", "use_aoti"}


def _described(explained: Any, base_dir: Path) -> dict:
    """``explain``'s output as a result's ``graphs``: the count, and each break's reason
    and the user's file (relative to ``base_dir``) and line."""
    reasons = []
    for r in explained.break_reasons:
        frame = r.user_stack[-1] if r.user_stack else None
        file = None
        if frame is not None:
            file = frame.filename
            try:
                file = Path(file).resolve().relative_to(base_dir.resolve()).as_posix()
            except ValueError:
                pass
        reasons.append(
            {"reason": _reason(r.reason), "file": file, "line": frame.lineno if frame else None}
        )
    return {"count": explained.graph_count, "breaks": len(reasons), "break_reasons": reasons}


def _reason(text: str) -> str:
    """A break's reason in one line: its headline and, when torch gives one, the
    explanation (which names the culprit, e.g. `print`)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    head = lines[0] if lines else "unknown"
    why = next(
        (ln.split(":", 1)[1].strip() for ln in lines[1:] if ln.startswith("Explanation:")), ""
    )
    return (f"{head}: {why}" if why else head)[:300]
