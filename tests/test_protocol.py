"""The messages to a worker: one model per action, told apart by ``action``, each
refusing a field of another action, with config sections as their models on both
sides of the JSON (no torch here: the parent builds these)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gatekeeper.boundary.protocol import (
    REQUEST,
    CompileRequest,
    DepsRequest,
    KindRef,
    MeasureRequest,
    VerifyRequest,
)
from gatekeeper.config import MeasureConfig, ModelConfig, ParityTolerance

TARGET = {
    "model": ModelConfig(name="m", factory="m:make", inputs=[{"shape": [2, 4]}]),
    "base_dir": ".",
    "device": "cpu",
    "shapes": {},
    "mode": "default",
    "dynamic": False,
    "kind": KindRef(name="whole", worker="gatekeeper.kinds.whole.worker:WHOLE"),
}


def test_each_action_reads_back_as_its_own_model_with_its_sections_typed():
    measure = MeasureRequest(
        **TARGET,
        budget=MeasureConfig(min_time=0.5),
        parity=ParityTolerance(atol=1e-3),
        reference_out="ref.pt",
    )
    back = REQUEST.validate_json(measure.model_dump_json())
    assert isinstance(back, MeasureRequest) and back == measure
    assert isinstance(back.budget, MeasureConfig) and back.budget.min_time == 0.5
    assert isinstance(back.parity, ParityTolerance) and back.parity.atol == 1e-3
    assert isinstance(REQUEST.validate_json(DepsRequest(**TARGET).model_dump_json()), DepsRequest)


def test_a_field_of_another_action_is_refused():
    with pytest.raises(ValidationError, match="budget"):
        CompileRequest(**TARGET, budget=MeasureConfig())
    doc = DepsRequest(**TARGET).model_dump() | {"action": "compile", "reference_in": "x"}
    with pytest.raises(ValidationError, match="reference_in"):
        REQUEST.validate_python(doc)
    with pytest.raises(ValidationError):  # a verification without its package
        VerifyRequest(**TARGET, parity=ParityTolerance())
