"""The float64 reference of ops that have no float64 kernel (gatekeeper.worker.fp64's
``Float64Kernels``): a mixture of experts' grouped matrix products."""

from __future__ import annotations

import copy

import pytest
import torch

from gatekeeper.worker.calls import Inputs
from gatekeeper.worker.fp64 import Float64Kernels
from gatekeeper.worker.parity import fp64_reference


def _offs(*ends: int) -> torch.Tensor:
    return torch.tensor(ends, dtype=torch.int32)


@pytest.mark.parametrize(
    "a, b, offs",
    [
        ((12, 8), (3, 8, 12), _offs(3, 3, 10)),  # 2D x 3D: tokens sorted by expert
        ((3, 4, 8), (8, 12), _offs(4, 4, 12)),  # 3D x 2D: the columns in groups
        ((4, 12), (12, 8), _offs(4, 8, 12)),  # 2D x 2D: the inner dimension in groups
        ((3, 4, 8), (3, 8, 12), None),  # 3D x 3D: a batched product
    ],
    ids=["2dx3d", "3dx2d", "2dx2d", "3dx3d"],
)
def test_grouped_mm_in_float64_is_torchs_own_product_group_by_group(a, b, offs):
    """torch's grouped_mm kernels take float32 and below: within ``Float64Kernels`` a
    float64 call computes each group's product in float64, and reads as torch's own
    float32 kernel does on the same numbers (an empty group included; past the last
    offset torch's output is whatever its buffer held, the float64 one zeros). Shapes
    keep every stride a multiple of 16 bytes, as torch's kernel needs."""
    torch.manual_seed(0)
    x, w = torch.randn(a), torch.randn(b)
    want = torch._grouped_mm(x, w, offs=offs)
    with pytest.raises(RuntimeError, match="Float32, BFloat16 or Float16"):
        torch._grouped_mm(x.double(), w.double(), offs=offs)  # why the mode exists
    with Float64Kernels():
        got = torch.nn.functional.grouped_mm(x.double(), w.double(), offs=offs)
        same = torch._grouped_mm(x, w, offs=offs)  # float32 operands: torch's kernel
    assert got.dtype == torch.float64 and got.shape == want.shape
    if len(a) == 2 and len(b) == 3:  # rows past the last offset: not part of any group
        end = int(offs[-1])
        assert not got[end:].any()
        got, want, same = got[:end], want[:end], same[:end]
    torch.testing.assert_close(got.float(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(same, want)


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
def test_a_mixture_of_experts_has_a_float64_reference(arch):
    """A stock mixture of experts (transformers runs its experts by ``grouped_mm``,
    which has no float64 kernel) had no float64 reference: its forward failed in float64
    and parity's RMSE rung was skipped for it. Its reference is now the float64 model's,
    the float64 copy with transformers' own loop over the experts (``eager``)."""
    import transformers

    cls, kw = {
        "mixtral": ("Mixtral", dict(num_local_experts=4)),
        "qwen2_moe": ("Qwen2Moe", dict(num_experts=4, moe_intermediate_size=32,
                                       shared_expert_intermediate_size=64)),
    }[arch]  # fmt: skip
    config = getattr(transformers, f"{cls}Config")(
        hidden_size=32, num_hidden_layers=1, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=512, num_experts_per_tok=2, **kw,
    )  # fmt: skip
    torch.manual_seed(0)
    model = getattr(transformers, f"{cls}ForCausalLM")(config).eval()
    ids = torch.randint(0, 512, (1, 24))
    ref = fp64_reference(model, Inputs(args=(ids,)))
    assert ref is not None
    (logits,) = [t for t in ref.leaves.values() if isinstance(t, torch.Tensor) and t.ndim == 3]
    want_model = copy.deepcopy(model)
    want_model.set_experts_implementation("eager")
    with torch.no_grad():
        want = want_model.double()(ids).logits
    assert logits.dtype == torch.float64
    torch.testing.assert_close(logits, want, rtol=1e-12, atol=1e-12)
    assert next(model.parameters()).dtype == torch.float32


def test_a_mixture_of_experts_prefills_in_float64():
    """A generation target's float64 prefill (the decode's reference) runs for a mixture
    of experts too: the last position's logits of the float64 copy with transformers' own
    loop over the experts, one row per prompt."""
    from transformers import MixtralConfig, MixtralForCausalLM

    from gatekeeper.worker.generate_parity import prefill_fp64

    config = MixtralConfig(
        hidden_size=32, num_hidden_layers=1, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=512, num_local_experts=4, num_experts_per_tok=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = MixtralForCausalLM(config).eval()
    prompts = [Inputs(args=(torch.randint(0, 512, (1, 24)),)) for _ in range(2)]
    got = prefill_fp64(model, prompts)
    assert got is not None and got.dtype == torch.float64
    want_model = copy.deepcopy(model).double()
    want_model.set_experts_implementation("eager")
    with torch.no_grad():
        want = torch.stack([p.call(want_model).logits[:, -1] for p in prompts])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_a_mixture_of_experts_trains_in_float64():
    """A training target's float64 trajectory (``fp64_reference``'s twin for training)
    was None for a mixture of experts, as its forward. It now runs, its backward through
    the group-at-a-time product: the same parameters after two AdamW steps as the float64
    copy's with transformers' own loop over the experts."""
    from transformers import MixtralConfig, MixtralForCausalLM

    from gatekeeper.config import ModelConfig
    from gatekeeper.worker.train_step import Trainer, fp64_trajectory, make_loss, run_steps

    config = MixtralConfig(
        hidden_size=32, num_hidden_layers=1, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=512, num_local_experts=4, num_experts_per_tok=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = MixtralForCausalLM(config)
    cfg = ModelConfig(
        name="moe", factory="m:make", inputs=[{"shape": [1, 24], "dtype": "int64", "high": 512}],
        tasks=["train"], train={"steps": 2},
    )  # fmt: skip
    inputs = Inputs(args=(torch.randint(0, 512, (1, 24)),))
    loss = make_loss(cfg, None, torch.zeros(1))
    got = fp64_trajectory(model, cfg, loss, inputs, "cpu")
    assert got is not None
    eager = copy.deepcopy(model).double()
    eager.set_experts_implementation("eager")
    t = Trainer(eager, cfg, loss, "cpu", "fp32")
    want = t.outputs(run_steps(t.step, inputs.double(), 2))
    assert set(got["params"]) == set(want["params"])
    for name, p in want["params"].items():
        assert got["params"][name].dtype == torch.float64
        torch.testing.assert_close(got["params"][name], p, rtol=1e-10, atol=1e-12)


def _rss() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_large_output_layers_float64_logits_lie_in_a_file(tmp_path, monkeypatch):
    """An output layer whose float64 output is 64 MiB (128 tokens x 65,536 words, 512
    features in): its float64 reference reads as the layer's product in float64, and
    computing and holding it adds less than its own 64 MiB to the resident set (it lies
    in a file of the scratch, each row handed back as it is written; what remains is
    the blocks' cast weights and products, about 30 MiB); held in memory, as before, it
    added the 64 MiB and the blocks, 89 MiB."""
    import tempfile

    import torch.nn.functional as F

    from gatekeeper.worker.filed import on_disk
    from gatekeeper.worker.fp64 import FILED_FROM, in_float64
    from gatekeeper.worker.memory import give_back

    if not on_disk(str(tmp_path)):
        pytest.skip("the temporary folder is memory (tmpfs): nothing to hand back")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    torch.manual_seed(0)
    head = torch.nn.Linear(512, 1 << 16, bias=False)
    x = torch.randn(1, 128, 512)
    give_back()
    before = _rss()
    with torch.no_grad(), in_float64(head):
        got = head(x)
    grew = _rss() - before
    assert got.dtype == torch.float64 and got.numel() * 8 >= FILED_FROM
    for cols in (slice(0, 3000), slice(40000, 41000), slice(-500, None)):
        want = F.linear(x.double(), head.weight[cols].double())
        assert torch.equal(got[..., cols], want)
    assert grew < got.numel() * 8, f"the resident set grew by {grew >> 20} MiB"
