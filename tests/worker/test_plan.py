"""The plan's estimate (gatekeeper.worker.plan): the weights' multiples each mode holds,
and where it refuses. On real modules, no compile."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gatekeeper import units
from gatekeeper.worker.fp64 import weight_bytes
from gatekeeper.worker.plan import WontFit, check_fits, estimate


def _model() -> nn.Module:
    m = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 8))
    m[2].weight = nn.Parameter(m[0].weight[:8].clone())
    return m


def test_weight_bytes_count_each_storage_once_and_buffers_too():
    m = _model()
    m.register_buffer("scale", torch.ones(10, dtype=torch.bfloat16))
    m.register_buffer("alias", m[0].weight)  # the same storage again: not counted twice
    assert weight_bytes(m) == (64 * 64 + 64 + 8 * 64 + 8) * 4 + 10 * 2
    assert weight_bytes(torch.tanh) == 0


def test_the_estimate_counts_what_each_mode_holds():
    m = _model()
    w = weight_bytes(m)
    check = estimate(m, "cpu", paired=False)
    assert check.copies == 1 and check.fp64_layer == (64 * 64 + 64) * 8
    assert check.peak == w + (64 * 64 + 64) * 8
    # paired: base and head; a model within twice the cache also gets eager's copy
    small = estimate(m, "cpu", paired=True)
    assert small.copies == 3 and "eager's copy" in small.why
    train = estimate(m, "cpu", paired=False, trainers=2, optimizer="Adam")
    assert train.copies == 1 + 2 * 4 and train.fp64_layer == 0
    assert estimate(m, "cpu", paired=False, trainers=2, optimizer="SGD").copies == 1 + 2 * 3


def test_it_refuses_past_the_limit_naming_the_estimate_and_the_ways_out():
    m = _model()
    est = estimate(m, "cpu", paired=True)
    check_fits(est, "cpu", est.peak, paired=True)  # exactly enough: it runs
    with pytest.raises(WontFit) as e:
        check_fits(est, "cpu", est.peak - 1, paired=True)
    said = str(e.value)
    assert said.startswith(f"needs about {units.size(est.peak)}: 3 x "), said
    assert "--mode stored" in said and "tensor parallel" in said and "\n" not in said
    # without a limit: what the device has free (this machine has more than 100 KiB)
    check_fits(est, "cpu", None, paired=True)
