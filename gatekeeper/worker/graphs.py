"""Graphs and graph breaks of a model, with each break's reason and the user's file:line."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

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
    """Graph count and breaks (``torch._dynamo.explain``; it resets dynamo, so explain
    every model before compiling anything). ``grad``: with autograd on (a training
    step); ``context``: entered around the call (autocast)."""
    with torch.set_grad_enabled(grad), context():
        explained = inputs.call(torch._dynamo.explain(model))
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
