"""``whole``: ``torch.compile`` of the whole model (its ``forward``, its method ``call``,
or the plain function). The default kind: it adds nothing to ids and keys. Its bundles
may carry a precompile package (:mod:`gatekeeper.kinds.precompile`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..base import DEFAULT, Kind

if TYPE_CHECKING:
    from ...config import ModelConfig


class Whole(Kind):
    name = DEFAULT
    worker = "gatekeeper.kinds.whole.worker:WHOLE"
    carries = ("precompile",)
    distributable = True

    def applies(self, model: ModelConfig, task: str, precision: str) -> bool:
        return True  # training steps too

    def spec(self, model: ModelConfig) -> dict[str, Any]:
        return {}


WHOLE = Whole()
