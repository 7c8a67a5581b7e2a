"""The paired measurement's set-up (gatekeeper.worker.measure)."""

from __future__ import annotations

import torch
from torch import nn

from gatekeeper.worker.measure import eager_model


def test_paired_eager_runs_on_weights_of_its_own():
    """Eager runs in every round right after base and head: on the head's own
    parameters it would warm the caches for the head alone (an identical head then read
    2-7% faster than its base). Paired, it gets a copy: the same values, other storage."""
    torch.manual_seed(0)
    head = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    eager = eager_model(head, paired=True)
    head_ptrs = {p.data_ptr() for p in head.parameters()}
    assert not head_ptrs & {p.data_ptr() for p in eager.parameters()}
    x = torch.randn(3, 8)
    assert torch.equal(eager(x), head(x))


def test_unpaired_eager_is_the_model_itself():
    """Alone, eager and compiled share the model: nothing to favour, no copy to hold."""
    head = nn.Linear(4, 4)
    assert eager_model(head, paired=False) is head
