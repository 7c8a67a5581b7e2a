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


def test_weight_bytes_count_a_quantized_weight_by_what_it_holds():
    """A torchao int8 weight-only Linear: its int8 data and its scales, not the float
    size its wrapper reports (an aot package's document said 1.34 MB of weights for a
    tiny Llama whose int8 weights were 0.75 MB: it counted them apart)."""
    torchao = pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig

    m = nn.Sequential(nn.Linear(256, 256, bias=False))
    float_bytes = weight_bytes(m)
    torchao.quantization.quantize_(m, Int8WeightOnlyConfig())
    assert type(m[0].weight) is not nn.Parameter or type(m[0].weight.data) is not torch.Tensor
    # int8 data, and a scale (and zero point) per output row: well under the float32
    assert 256 * 256 <= weight_bytes(m) < 256 * 256 + 256 * 16 < float_bytes


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


def test_a_model_on_the_meta_device_weighs_what_it_will_weigh_built(tmp_path):
    """The plan before the build estimates from the factory's model on the meta device
    (gatekeeper.worker.model.on_meta): every tensor there, even where the factory names
    its own device, each storage counted once: a tied weight once, and every other
    (meta storages all have address 0: each was taken for the first one, so a model
    weighed its first tensor)."""
    from gatekeeper.config import ModelConfig
    from gatekeeper.worker.model import load_callable, on_meta

    (tmp_path / "factories.py").write_text(
        "import torch\n"
        "from torch import nn\n"
        "def tied():\n"
        "    with torch.device('cpu'):  # its own device: on the meta device all the same\n"
        "        m = nn.Sequential(\n"
        "            nn.Embedding(1000, 64), nn.LayerNorm(64), nn.Linear(64, 1000, bias=False)\n"
        "        )\n"
        "    m[2].weight = m[0].weight\n"
        "    return m\n"
        "def values():\n"
        "    m = nn.Linear(4, 4)\n"
        "    assert m.weight.detach().sum().item() != 0.5\n"
        "    return m\n"
    )

    def cfg(factory: str) -> ModelConfig:
        return ModelConfig.model_validate(
            {"name": "m", "factory": f"factories:{factory}", "inputs": [{"shape": [1]}]}
        )

    meta = on_meta(cfg("tied"), tmp_path)
    assert meta is not None and {t.device.type for t in meta.parameters()} == {"meta"}
    assert weight_bytes(meta) == (1000 * 64 + 64 + 64) * 4
    assert weight_bytes(load_callable("factories:tied", tmp_path)()) == weight_bytes(meta)
    assert on_meta(cfg("values"), tmp_path) is None  # reads a value: planned once built


def test_the_memory_given_is_the_address_space_limit_where_it_is_the_least(tmp_path):
    """Without GATEKEEPER_MEMORY_LIMIT, what a CPU can still give is the least of the
    machine's available memory, what ``ulimit -v`` leaves the process and its cgroup's
    ``memory.max``: a 40B model under a 6 GiB address-space limit is refused by it."""
    import subprocess
    import sys

    code = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))\n"
        "from gatekeeper.worker.plan import available\n"
        "have, says = available('cpu')\n"
        "print(have, says)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    have, says = out.stdout.split(maxsplit=1)
    assert 0 < int(have) < 6 << 30 and says.strip() == "the address-space limit (ulimit -v) leaves"
    est = estimate(nn.Linear(4, 4), "cpu", paired=False)
    big = type(est)(40 << 30, 1.0, 0, "the model")
    with pytest.raises(WontFit) as e:
        check_fits(big, "cpu", None, paired=False, built=False)
    assert "not built (planned on the meta device)" in str(e.value)
