"""The profile of a target's calls (gatekeeper.worker.profile), by the real profiler."""

from __future__ import annotations

import json

import torch

from gatekeeper.worker import profile


def test_calls_are_profiled_a_session_at_a_time_and_summed_per_call(monkeypatch, tmp_path):
    """The profiler's record of a call grows the resident set with the call's operators
    (about 10 MB a call of a Qwen2-0.5B), and 20 calls in one session stood 0.2 GB over
    the timed rounds, that model's check's highest point after its float64 reference
    (docs/scale.md). The calls are profiled ``SESSION`` at a time; the figures per call
    are the same as one session's."""
    sessions = []

    class Counted(torch.profiler.profile):
        def __enter__(self):
            sessions.append(self)
            return super().__enter__()

    monkeypatch.setattr(torch.profiler, "profile", Counted)
    x = torch.randn(8, 8)

    def call():
        return torch.mm(torch.add(x, 1), x).relu()

    trace = tmp_path / "trace.json"
    got = profile.profile_calls(call, "cpu", calls=12, trace=str(trace))
    assert len(sessions) == -(-12 // profile.SESSION) > 1
    ops = {op["name"]: op for op in got["ops"]}
    assert got["calls"] == 12
    for name in ("aten::mm", "aten::add", "aten::relu"):
        assert ops[name]["count"] == 1.0 and ops[name]["self_us"] > 0
    events = json.loads(trace.read_text())["traceEvents"]
    mms = [e for e in events if e.get("name") == "aten::mm"]
    assert len(mms) == profile.SESSION  # the trace: the first session's calls
