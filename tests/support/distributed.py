"""The distributed targets' project (tests/e2e/test_distributed.py,
benchmarks/distributed.py): a DDP training step, a tensor-parallel MLP (colwise then
rowwise) and an FSDP2 forward, 2 ranks each, and a pull request that makes rank 1 do
more work."""

from __future__ import annotations

import textwrap

MODELS = textwrap.dedent("""
    import ctypes
    import os
    import time

    import torch
    import torch.distributed as dist
    from torch import nn

    import gatekeeper


    class MLP(nn.Module):
        def __init__(self, d=64):
            super().__init__()
            self.fc1 = nn.Linear(d, 4 * d)
            self.fc2 = nn.Linear(4 * d, d)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))


    def ddp():
        from torch.nn.parallel import DistributedDataParallel

        torch.manual_seed(0)
        return DistributedDataParallel(MLP())


    def tp():
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        torch.manual_seed(0)
        plan = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
        return parallelize_module(MLP(), gatekeeper.device_mesh(), plan)


    def fsdp():
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(0)
        m = MLP()
        fully_shard(m.fc1)
        fully_shard(m.fc2)
        fully_shard(m)
        return m


    def plain():
        torch.manual_seed(0)
        return MLP()


    class Crash(nn.Module):
        def forward(self, x):
            if dist.get_rank() == 1:
                ctypes.string_at(0)  # rank 1 dies by SIGSEGV
            dist.all_reduce(x)
            return x * 2


    def crash():
        return Crash()


    # outputs that differ by rank: each rank's parity needs its own reference
    class Ranked(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 64)

        def forward(self, x):
            y = self.fc(x)
            dist.all_reduce(y)
            return y * (dist.get_rank() + 1)


    def ranked():
        torch.manual_seed(0)
        return Ranked()


    class Hang(nn.Module):
        def forward(self, x):
            if dist.get_rank() == 1:
                time.sleep(120)  # rank 1 never reaches the collective in time
            dist.all_reduce(x)
            return x * 2


    def hang():
        return Hang()
""")

# rank 1 runs eight 256x256 matmuls more per call, on values that depend on the input
# (nothing to fold at compile time); the output moves by 1e-30 (nothing at float32 next
# to values near 1), so parity against the base still passes
SLOW_RANK_1 = """
        def forward(self, x):
            h = torch.relu(self.fc1(x))
            if dist.get_rank() == 1:
                z = (h.mean() + torch.ones(256, 256)) / 256
                for _ in range(8):
                    z = torch.tanh(z @ z)
                h = h + 1e-30 * z.mean()
            return self.fc2(h)
"""

CONFIG = textwrap.dedent("""
    store = "store"
    precompile = "off"

    [measure]
    min_time = 1.0

    # wide thresholds: the tests check the mechanism, on a shared 2-core machine
    [gate]
    latency_regression = 0.5
    speedup_regression = 0.5
    compile_time_regression = 1.0

    [[models]]
    name = "ddp"
    factory = "distmodels:ddp"
    inputs = [{ shape = ["batch", 64] }]
    shapes = [{ batch = 8 }]
    tasks = ["train"]
    distributed = { world_size = 2 }

    [[models]]
    name = "tp"
    factory = "distmodels:tp"
    inputs = [{ shape = ["batch", 64] }]
    shapes = [{ batch = 8 }]
    distributed = { world_size = 2, mesh = { tp = 2 } }

    [[models]]
    name = "fsdp"
    factory = "distmodels:fsdp"
    inputs = [{ shape = ["batch", 64] }]
    shapes = [{ batch = 8 }]
    distributed = { world_size = 2 }
""")

TARGETS = ["ddp/b8/default+train+ws2", "tp/b8/default+ws2", "fsdp/b8/default+ws2"]
