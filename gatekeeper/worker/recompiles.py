"""Recompiles counted, each with the guard that failed as torch reports it
(``get_compilation_metrics()[i].recompile_reason``), leaving out the compiles made on
purpose.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

# the compiles made on purpose (:func:`on_purpose`) since :func:`start_counting` (held,
# so that no other record can take an id of theirs)
_ON_PURPOSE: list[Any] = []


def start_counting() -> None:
    """From now on, every compile torch records is counted (see :func:`recompiles`)."""
    from torch._dynamo.utils import clear_compilation_metrics

    clear_compilation_metrics()
    _ON_PURPOSE.clear()


@contextlib.contextmanager
def on_purpose() -> Iterator[None]:
    """The compiles torch records inside are not counted by :func:`recompiles`."""
    from torch._dynamo.utils import get_compilation_metrics

    held = get_compilation_metrics()  # alive, so that no new record takes an id
    before = {id(m) for m in held}
    yield
    _ON_PURPOSE.extend(m for m in get_compilation_metrics() if id(m) not in before)


def recompiles() -> tuple[int, list[str]]:
    """Recompiles since :func:`start_counting`, and the guard that failed for each; the
    compiles made :func:`on_purpose` are not counted."""
    from torch._dynamo.utils import get_compilation_metrics

    skip = {id(m) for m in _ON_PURPOSE}
    reasons = [_recompile_reason(m) for m in get_compilation_metrics() if id(m) not in skip]
    said = [" ".join(r.split())[:300] for r in reasons if r]
    return len(said), said


def _recompile_reason(m: Any) -> str | None:
    """Why torch recompiled a frame (None: it was a first compile). A torch whose
    metrics name no reason (2.6) says a recompile by the frame's earlier entries."""
    if hasattr(m, "recompile_reason"):
        return m.recompile_reason
    if getattr(m, "cache_size", 0):
        return f"a guard failed in {m.co_name} (torch {torch.__version__} names no reason)"
    return None
