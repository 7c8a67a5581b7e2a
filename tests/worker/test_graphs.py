"""Graphs and graph breaks from the compile's own trace (gatekeeper.worker.graphs.Traced)
say what ``torch._dynamo.explain`` says, and the compile that records them is the
compile as configured: the same FX graph cache keys (issue 52: no second trace per side).
Real inductor compiles of a two-line model, in this process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from gatekeeper.config import ModelConfig
from gatekeeper.worker.calls import Inputs
from gatekeeper.worker.compiler import compile_kwargs, compile_model, snapshot_counters
from gatekeeper.worker.graphs import Traced, graph_breaks
from gatekeeper.worker.train_step import Trainer, make_loss

HERE = Path(__file__).parent


class Breaks(nn.Module):
    """Three graphs: a data-dependent branch and a print break it."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 2)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if h.sum().item() > 0:  # break 1: .item()
            h = h * 2
        print(end="")  # break 2
        return self.b(h)


def _cfg(**kw) -> ModelConfig:
    return ModelConfig(name="m", factory="m:make", inputs=[{"shape": [4, 8]}], **kw)


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    counters.clear()
    yield tmp_path
    torch._dynamo.reset()


def test_a_compiles_own_trace_says_what_explain_says_and_keeps_its_cache_keys(fresh_cache):
    torch.manual_seed(0)
    model, inputs = Breaks().eval(), Inputs((torch.randn(4, 8),))
    with torch.no_grad():
        explained = graph_breaks(model, inputs, HERE)
        plain = compile_model(model, _cfg(), "default", False)
        inputs.call(plain)
        written = snapshot_counters()
        torch._dynamo.reset()
        counters.clear()
        traced = Traced(HERE)
        recorded = compile_model(model, _cfg(), "default", False, traced=traced)
        out = inputs.call(recorded)
        graphs = traced.graphs()
        read = snapshot_counters()
    assert explained["count"] == 3 and explained["breaks"] == 2, explained
    assert graphs == explained  # count, breaks, each reason and its file:line
    assert graphs["break_reasons"][0]["file"] == "test_graphs.py", graphs
    # the recording compile is the configured one: every graph the plain compile wrote
    # is a hit, none compiled anew
    assert written["fxgraph_cache_miss"] == 3 and written["fxgraph_cache_hit"] == 0, written
    assert read["fxgraph_cache_hit"] == 3 and read["fxgraph_cache_miss"] == 0, read
    torch.testing.assert_close(out, model(*inputs.args))


def test_a_training_steps_trace_says_what_explain_says(fresh_cache):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    cfg = ModelConfig(name="m", factory="m:make", inputs=[{"shape": [4, 8]}], tasks=["train"])
    inputs = Inputs((torch.randn(4, 8),))
    loss = make_loss(cfg, HERE, model(*inputs.args))

    def trainer() -> Trainer:
        return Trainer.copy_of(model, cfg, loss, "cpu", "fp32", HERE)

    explained = graph_breaks(trainer().step, inputs, HERE, grad=True)
    torch._dynamo.reset()
    traced = Traced(HERE)
    inputs.call(compile_model(trainer().step, cfg, "default", False, False, traced=traced))
    assert traced.graphs() == explained
    assert explained["count"] >= 2, explained  # the step breaks at backward


@pytest.mark.parametrize(
    ("kw", "mode", "wraps"),
    [
        ({}, "default", True),
        ({}, "max-autotune-no-cudagraphs", True),
        ({"backend": "aot_eager"}, "default", True),
        ({"options": {"max_autotune": False}}, "default", True),
        ({"options": {"use_aoti": False}}, "default", False),  # torch.compile pops it
    ],
)
def test_which_compiles_record_their_trace(kw, mode, wraps):
    """A backend by name, any mode or options: recorded; options torch.compile itself
    takes out: explained apart (the caller asks :meth:`Traced.wraps` first)."""
    kwargs = compile_kwargs(_cfg(**kw), mode, False)
    assert Traced.wraps(kwargs) is wraps
    wrapped = Traced(HERE).compile_kwargs(kwargs)
    assert (wrapped is not None) is wraps
    if wrapped is not None:  # the mode and options went into the wrapped backend
        assert "mode" not in wrapped and "options" not in wrapped
        assert wrapped["dynamic"] is False and wrapped["fullgraph"] == kwargs["fullgraph"]
