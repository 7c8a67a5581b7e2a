"""A generate target's ``generate()`` loop (gatekeeper/worker/generate.py) compiles the
model's ``forward`` as docs/generation.md's service does (no ``dynamic``): a stock
MistralForCausalLM, whose static cache keeps each sliding layer's length as a Python int
that grows every step, decodes with no recompile after the first decode step (compiled
with ``dynamic=False``, every step recompiled until Dynamo's limit: its bundle missed
what the service compiles and an unchanged pull request was ``regressed``). Dynamo only
(``backend = "eager"``): which graphs it captures is what this is about, and it takes
seconds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gatekeeper.config import ModelConfig
from gatekeeper.worker.calls import Inputs
from gatekeeper.worker.generate import HFLoop
from gatekeeper.worker.recompiles import recompiles, start_counting

transformers = pytest.importorskip("transformers")


def _mistral() -> torch.nn.Module:
    """A stock one-layer MistralForCausalLM: its config's sliding window (4096) makes
    its static cache's every layer a sliding one."""
    config = transformers.MistralConfig(
        vocab_size=2048,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return transformers.MistralForCausalLM(config).eval()


def test_a_stock_mistral_decodes_on_a_static_cache_with_no_recompile():
    torch._dynamo.reset()
    model = ModelConfig.model_validate(
        {
            "name": "lm",
            "factory": "lm:make_lm",
            "inputs": {"input_ids": {"shape": [1, 32], "dtype": "int64", "high": 2048}},
            "tasks": ["generate"],
            "generate": {"new_tokens": 16},
            "backend": "eager",
        }
    )
    req = SimpleNamespace(model=model, mode="default", dynamic=False, device="cpu")
    loop = HFLoop(_mistral(), req, prompt=(1, 32))  # type: ignore[arg-type]
    loop.compile()
    ids = Inputs(kwargs={"input_ids": torch.randint(0, 2048, (1, 32))})

    def at(tokens: int) -> None:
        if tokens == 2:  # the first decode step done: steady decode from here
            start_counting()

    run = loop.run(ids, at=at)
    assert len(run.gaps) == 15
    count, guards = recompiles()
    assert count == 0, guards
    loop.run(ids)  # a second generation compiles nothing either
    assert recompiles()[0] == 0
