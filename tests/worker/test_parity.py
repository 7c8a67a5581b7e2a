"""Parity compares structure as well as numbers: the output tree, dict keys as a set,
sequence lengths and each leaf's dtype and shape, naming the leaf that differs."""

from __future__ import annotations

import copy
from collections import OrderedDict

import pytest
import torch

from gatekeeper.config import ParityTolerance
from gatekeeper.worker.calls import Inputs
from gatekeeper.worker.parity import (
    Outputs,
    check_parity,
    fp64_reference,
    load_reference,
    save_reference,
    vs_eager,
)
from gatekeeper.worker.procmaps import file_mappings
from gatekeeper.worker.tf32 import (
    accuracy_settings,
    bakes_tf32,
    precise,
    restore,
    settings,
    tf32_capable,
    tf32_eager,
    tf32_in_force,
    to_tf32,
)

TOL = ParityTolerance(atol=1e-4, rtol=1e-4, cosine=0.99)
A, B = torch.randn(4, 3, generator=torch.Generator().manual_seed(0)), torch.arange(6)


def parity(candidate, reference, ref64=None):
    return check_parity(Outputs.of(candidate), Outputs.of(reference), ref64, TOL)


def test_identical_outputs_pass():
    assert parity({"logits": A, "ids": B}, {"logits": A.clone(), "ids": B.clone()})["passed"]


def test_dict_key_order_does_not_matter():
    assert parity({"logits": A, "ids": B}, {"ids": B, "logits": A})["passed"]


@pytest.mark.parametrize(
    "candidate, reference, method, leaf",
    [
        ({"scores": A}, {"logits": A}, "structure", "output"),
        ({"logits": A.half()}, {"logits": A}, "dtype", "output['logits']"),
        ((B.int(),), (B,), "dtype", "output[0]"),
        ([A, B], (A, B), "structure", "output"),
        ((A,), (A, B), "structure", "output"),
        (A[:2], A, "shape", "output"),
        ({"x": (A, A)}, {"x": (A, B)}, "dtype", "output['x'][1]"),
        (OrderedDict(logits=A), {"logits": A}, "structure", "output"),
    ],
)
def test_a_different_structure_fails_naming_the_leaf(candidate, reference, method, leaf):
    got = parity(candidate, reference)
    assert not got["passed"] and got["method"] == method, got
    assert got["detail"].startswith(leaf), got["detail"]


def test_numbers_still_decide_within_one_structure():
    got = parity({"logits": A * 1.01}, {"logits": A})
    assert not got["passed"] and "output['logits']" in got["detail"]
    assert parity({"logits": A + 1e-7}, {"logits": A})["passed"]


def test_nan_fails():
    bad = A.clone()
    bad[0, 0] = float("nan")
    assert parity(bad, A)["method"] == "nan-inf"


def test_reference_file_round_trip(tmp_path):
    out = {"logits": A, "extra": [B, 3]}
    path = tmp_path / "ref.pt"
    save_reference(str(path), Outputs.of(out), Outputs.of({"logits": A.double(), "extra": [B, 3]}))
    loaded, fp64 = load_reference(str(path))
    assert loaded.structure == Outputs.of(out).structure
    assert check_parity(Outputs.of(out), loaded, fp64, TOL)["passed"]
    renamed = check_parity(Outputs.of({"scores": A, "extra": [B, 3]}), loaded, fp64, TOL)
    assert not renamed["passed"] and renamed["method"] == "structure"


def test_an_old_flat_reference_still_loads_and_checks_dtypes(tmp_path):
    path = tmp_path / "old.pt"
    torch.save({"compiled": [A, B], "fp64": [A.double(), B]}, path)  # format 1
    loaded, fp64 = load_reference(str(path))
    assert loaded.structure is None
    assert check_parity(Outputs.of((A, B)), loaded, fp64, TOL)["passed"]
    assert check_parity(Outputs.of((A.half(), B)), loaded, fp64, TOL)["method"] == "dtype"


# -- the rule on CUDA: TF32, as PyTorch's accuracy checks take it into account ------------
def test_tf32_keeps_the_first_ten_mantissa_bits_as_tensor_cores_read_them():
    ulp = 2.0**-10  # TF32's unit in the last place at 1
    x = torch.tensor([1 + ulp / 2, 1 + 0.99 * ulp, -(1 + 1.5 * ulp), 3.0, 0.0, -0.0])
    got = to_tf32(x)
    assert got.tolist() == [1.0, 1.0, -(1 + ulp), 3.0, 0.0, -0.0]  # truncated toward zero
    assert (got.view(torch.int32) & 0x1FFF).eq(0).all()  # 13 low bits of 23 dropped
    nearest = to_tf32(x, nearest=True)  # a kernel that converts first: ties away from zero
    assert nearest.tolist() == [1 + ulp, 1 + ulp, -(1 + 2 * ulp), 3.0, 0.0, -0.0]
    special = to_tf32(torch.tensor([float("inf"), float("-inf"), float("nan")]))
    assert special[:2].tolist() == [float("inf"), float("-inf")] and special[2].isnan()
    rand = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    rel = ((to_tf32(rand) - rand) / rand).abs()
    assert rel.max().item() < 2.0**-10 and rel.mean().item() > 2.0**-13  # really dropped


def test_tf32_eager_reads_the_operands_of_matmuls_and_convolutions_only():
    gen = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(64, 32)
    x = torch.randn(8, 64, generator=gen)
    (got,) = tf32_eager(lin, Inputs((x,)), conv=False, matmul=True).leaves.values()
    want = to_tf32(x).double() @ to_tf32(lin.weight).double().T + lin.bias.double()
    assert torch.allclose(got.double(), want, atol=1e-5)
    with torch.no_grad():
        assert not torch.allclose(got, lin(x), atol=1e-6)  # it did read them so
    conv = torch.nn.Conv2d(3, 4, 3)
    img = torch.randn(1, 3, 8, 8, generator=gen)
    with torch.no_grad():
        plain = conv(img)
    (conv_tf32,) = tf32_eager(conv, Inputs((img,)), conv=True, matmul=False).leaves.values()
    (conv_mm,) = tf32_eager(conv, Inputs((img,)), conv=False, matmul=True).leaves.values()
    assert not torch.equal(conv_tf32, plain) and torch.equal(conv_mm, plain)
    assert tf32_eager(lin, Inputs((x,)), conv=False, matmul=False) is None


class Convnet(torch.nn.Module):
    """A small residual convolution stack (the stock ResNet's parity failure on CUDA was
    its convolutions): ``scale`` multiplies one block's output, ``act`` is the activation."""

    def __init__(self, scale: float = 1.0, act=torch.nn.GELU) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(16, 16, 3, padding=1) for _ in range(6))
        self.head = torch.nn.Linear(16, 10)
        for p in self.parameters():
            torch.nn.init.normal_(
                p, std=(2 / p[0].numel()) ** 0.5 if p.dim() > 1 else 0.1, generator=gen
            )
        self.act, self.scale = act(), scale

    def forward(self, x):
        h = self.act(self.stem(x))
        for i, c in enumerate(self.convs):
            h = h + self.act(c(h)) * (self.scale if i == 3 else 1.0)
        return self.head(h.mean((2, 3)))


INPUTS = Inputs((torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(2)),))
# so that allclose alone decides nothing
EXACT = TOL.model_copy(update={"atol": 1e-7, "rtol": 1e-7})


def rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).square().mean().sqrt().item()


def rounded_to_tf32(t: torch.Tensor) -> torch.Tensor:
    """The test's own TF32, independent of the emulator under test: each float32 value
    rounded to 11 significant bits (TF32's implicit 1 and 10-bit mantissa), round half
    to even, by plain arithmetic on the mantissa (frexp: ``t = m * 2**e``, 0.5 <= |m| < 1)."""
    m, e = torch.frexp(t.double())
    return torch.ldexp(torch.round(m * 2.0**11) / 2.0**11, e)  # torch.round: half to even


class Tf32Conv(torch.nn.Module):
    """A convolution as a TF32 tensor core computes it: operands rounded to TF32, products
    and sums in fp64 (wider than the kernel's fp32 accumulator), the result in float32."""

    def __init__(self, conv: torch.nn.Conv2d) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x):
        c = self.conv
        w, b = rounded_to_tf32(c.weight), c.bias.double()
        y = torch.nn.functional.conv2d(rounded_to_tf32(x), w, b, c.stride, c.padding)
        return y.float()


def compiled_like(model, tf32: bool):
    """What a compiled model returns: its own layout (channels-last, as inductor lays
    out convolutions) and summation order, with TF32 convolutions (the test's own,
    :class:`Tf32Conv`) or without."""
    m = copy.deepcopy(model).to(memory_format=torch.channels_last)
    img = INPUTS.args[0].contiguous(memory_format=torch.channels_last)
    if tf32:
        m.stem = Tf32Conv(m.stem)
        m.convs = torch.nn.ModuleList(Tf32Conv(c) for c in m.convs)
    with torch.no_grad():
        return Outputs.of(m(img))


def test_the_tests_own_tf32_rounds_half_to_even_to_ten_mantissa_bits():
    ulp = 2.0**-10
    x = torch.tensor([1 + ulp / 2, 1 + 1.5 * ulp, 1 + 0.49 * ulp, -(1 + 0.51 * ulp), 3.0])
    assert rounded_to_tf32(x).tolist() == [1.0, 1 + 2 * ulp, 1.0, -(1 + ulp), 3.0]


def planted(model, **change):
    changed = Convnet(**change).eval()
    changed.load_state_dict(model.state_dict())
    return changed


def test_with_cudnns_tf32_off_as_in_pytorchs_accuracy_runs_planted_changes_fail():
    model = Convnet().eval()
    with torch.no_grad():
        eager = Outputs.of(model(*INPUTS.args))
    ref64 = fp64_reference(model, INPUTS).leaves
    got = check_parity(compiled_like(model, tf32=False), eager, ref64, EXACT)
    assert got["passed"] and got["method"] == "fp64-rmse", got
    for change in ({"scale": 1.01}, {"act": torch.nn.ReLU}):
        failed = check_parity(compiled_like(planted(model, **change), False), eager, ref64, EXACT)
        assert not failed["passed"] and failed["method"] == "failed", (change, failed)


def test_where_the_compiled_kernels_keep_tf32_eagers_own_error_is_taken_at_tf32():
    model = Convnet().eval()
    with torch.no_grad():
        eager = Outputs.of(model(*INPUTS.args))
    ref64 = fp64_reference(model, INPUTS).leaves
    at_tf32 = tf32_eager(model, INPUTS, conv=True, matmul=False).leaves
    compiled = compiled_like(model, tf32=True)
    # eager at float32 cannot account for TF32 kernels' error: the false failure
    assert not check_parity(compiled, eager, ref64, EXACT)["passed"]
    got = check_parity(compiled, eager, ref64, EXACT, at_tf32)
    assert got["passed"] and got["method"] == "tf32-rmse", got
    # without an fp64 reference, eager's TF32 error is measured from eager itself
    assert check_parity(compiled, eager, None, EXACT, at_tf32)["method"] == "tf32-rmse"
    failed = check_parity(
        compiled_like(planted(model, act=torch.nn.ReLU), True), eager, ref64, EXACT, at_tf32
    )
    assert not failed["passed"], failed
    # the emulator's rounding to nearest is the test's own TF32: the same error, within 10%
    ((leaf, c),) = compiled.leaves.items()
    (near,) = tf32_eager(model, INPUTS, conv=True, matmul=False, nearest=True).leaves.values()
    own, emulated = rmse(c, ref64[leaf]), rmse(near, ref64[leaf])
    assert abs(emulated / own - 1) < 0.1, (emulated, own)


def test_on_cpu_nothing_changes_the_ladder():
    assert tf32_in_force("cpu", baked=True) == (False, False)
    assert not tf32_capable("cpu")
    before = settings()
    with accuracy_settings("cpu", baked=False):
        assert settings() == before  # no TF32 on a CPU: nothing to turn off
    model = torch.nn.Linear(16, 4)
    with torch.no_grad():
        out = model(*INPUTS_LINEAR.args)
    got, ref64 = vs_eager(Outputs.of(out * 1.01), model, model, INPUTS_LINEAR, None, "cpu", TOL)
    assert not got["passed"] and ref64.value() is not None
    same = vs_eager(Outputs.of(out), model, model, INPUTS_LINEAR, None, "cpu", TOL)[0]
    assert same["method"] == "allclose"


INPUTS_LINEAR = Inputs((torch.randn(2, 16, generator=torch.Generator().manual_seed(4)),))


def test_max_autotune_bakes_cudnns_flag_into_its_convolutions():
    assert bakes_tf32("max-autotune", None) and bakes_tf32("max-autotune-no-cudagraphs", None)
    assert not bakes_tf32("default", None) and not bakes_tf32("reduce-overhead", None)
    assert bakes_tf32("default", {"max_autotune": True})
    assert not bakes_tf32("max-autotune", {"triton.cudagraphs": False})  # options win


def test_precise_turns_tf32_and_reductions_off_and_puts_every_setting_back():
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = settings()
    guard = torch._C._dynamo.guards.GlobalStateGuard()  # what Dynamo's guards compare
    try:
        # a deploy that asked for TF32 everywhere and no fp16 reduced-precision reductions
        matmul.allow_tf32, cudnn.allow_tf32 = True, True
        matmul.allow_fp16_reduced_precision_reduction = False
        chosen, chosen_guard = settings(), torch._C._dynamo.guards.GlobalStateGuard()
        with precise():
            assert not matmul.allow_tf32 and not cudnn.allow_tf32
            assert not matmul.allow_fp16_reduced_precision_reduction
            assert not matmul.allow_bf16_reduced_precision_reduction
            assert not chosen_guard.check()  # the positive control: the guard sees it
        assert settings() == chosen and chosen_guard.check()
    finally:
        restore(before)
    with precise():
        pass
    assert settings() == before and guard.check()


class _Shapes(torch.nn.Module):
    """What stock models hold: a tied weight, a buffer, a ModuleList and a
    ParameterList (containers that never run: their parent reads them), a root
    parameter, and a layer that computes internally in float32 whatever it is given."""

    def __init__(self, reach: bool = False) -> None:
        super().__init__()
        self.reach = reach
        self.emb = torch.nn.Embedding(16, 8)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))
        self.scales = torch.nn.ParameterList(torch.nn.Parameter(torch.rand(8)) for _ in range(3))
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight
        self.shift = torch.nn.Parameter(torch.randn(8))
        self.register_buffer("inv", torch.rand(8))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids) * self.inv
        for layer, scale in zip(self.layers, self.scales, strict=True):
            x = torch.tanh(layer(x)) * scale + self.shift
        if self.reach:  # a weight read outside its own module's forward
            return torch.nn.functional.linear(x, self.emb.weight)
        return self.head(x)


@pytest.mark.parametrize("reach", [False, True])
def test_the_fp64_reference_is_the_float64_models_without_a_float64_copy(reach):
    """The reference was ``copy.deepcopy(model).double()``'s outputs: a float64 copy of
    the whole model (2x an fp32 model's bytes, 4x a bf16 one's). Now each module's own
    weights are float64 only during its forward: the outputs are the same bits, never
    more than one layer's weights exist in float64 at once, and the model's weights are
    its own again afterwards (same storage, dtype and values). A model that reads a
    weight outside its module (``reach``) is small here: it falls back to the copy."""
    torch.manual_seed(0)
    model = _Shapes(reach).eval()
    ids = Inputs(args=[torch.randint(0, 16, (2, 5))], kwargs={})
    with torch.no_grad():
        want = copy.deepcopy(model).double()(ids.args[0])
    before = {n: (t.data_ptr(), t.dtype, t.clone()) for n, t in model.state_dict().items()}
    widest = [0]

    def count(*_):
        fp64 = {
            t.data_ptr(): t.numel() * 8
            for t in [*model.parameters(), *model.buffers()]
            if t.dtype == torch.float64
        }
        widest[0] = max(widest[0], sum(fp64.values()))

    hooks = [m.register_forward_hook(count) for m in model.modules() if m is not model]
    got = fp64_reference(model, ids)
    for h in hooks:
        h.remove()
    assert got is not None
    (leaf,) = got.leaves.values()
    assert torch.equal(leaf, want)
    whole = sum(t.numel() * 8 for t in model.state_dict().values() if t.is_floating_point())
    if not reach:
        assert 0 < widest[0] < whole / 2, (widest[0], whole)
    after = model.state_dict()
    for n, (ptr, dtype, values) in before.items():
        assert after[n].data_ptr() == ptr and after[n].dtype == dtype
        assert torch.equal(after[n], values)


@pytest.mark.parametrize("tied", [False, True])
def test_large_linear_and_embedding_layers_are_never_cast_whole_to_float64(monkeypatch, tied):
    """A causal LM's input embedding and output layer (each 2048 x 32000 for the 1B
    model: 0.52 GB in float64) were cast whole for their forwards. Over ``fp64.BLOCK``
    bytes in float64, a linear layer now casts a block of its rows for each product and
    an embedding casts the rows it looks up: no float64 copy of either weight exists,
    the outputs are the float64 model's (a tied weight too), each layer is as it was
    afterwards, and the plan's estimate counts a block, not the layer."""
    from gatekeeper.worker import fp64
    from gatekeeper.worker.plan import estimate

    torch.manual_seed(0)
    model = _Shapes().eval()
    if not tied:  # untied, with a bias: 16 x 8 weights, 1 KiB in float64
        model.head = torch.nn.Linear(8, 16)
    ids = Inputs(args=[torch.randint(0, 16, (2, 5))], kwargs={})
    with torch.no_grad():
        want = copy.deepcopy(model).double()(ids.args[0])
    whole = estimate(model, "cpu", paired=False).fp64_layer
    monkeypatch.setattr(fp64, "BLOCK", 4 * 8 * 8)  # 4 rows of 8 inputs per product
    seen: list[torch.dtype] = []
    for layer in (model.emb, model.head):
        layer.register_forward_hook(lambda m, *_: seen.append(m.weight.dtype))
    got = fp64_reference(model, ids)
    assert got is not None
    (leaf,) = got.leaves.values()
    assert leaf.dtype == torch.float64
    torch.testing.assert_close(leaf, want, rtol=1e-12, atol=1e-12)
    assert seen == [torch.float32, torch.float32]  # neither weight became float64
    for layer in (model.emb, model.head):
        assert "forward" not in vars(layer) and layer.weight.dtype == torch.float32
    parts = estimate(model, "cpu", paired=False).fp64_layer
    assert parts < whole, (parts, whole)


def test_a_large_embedding_of_a_subclass_casts_only_the_rows_it_looks_up(monkeypatch):
    """Gemma 3's input embedding is a subclass of ``nn.Embedding`` (its rows times a
    scale it holds), and only a plain ``nn.Embedding`` looked its rows up: this one was
    cast whole to float64 for its forward (a 262,144-word vocabulary: 1.34 GB at
    Gemma-3-270M's size, on top of the model's 1.07 GB; its check read 2.99x its
    weights, issue 53). Now it runs its own forward on a float64 table of the rows it
    looks up: the stock model's reference is the float64 copy's, the float64
    reference's peak (the profiler's allocation events) stays well under the table in
    float64, and the layer is as it was afterwards."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from gatekeeper.worker import fp64
    from gatekeeper.worker.memory import _cpu_peak

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        hidden_size=64, num_hidden_layers=1, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, vocab_size=262144, tie_word_embeddings=True,
    )  # fmt: skip
    model = Gemma3ForCausalLM(config).eval()
    embed = model.get_input_embeddings()
    assert type(embed) is not torch.nn.Embedding and isinstance(embed, torch.nn.Embedding)
    ids = torch.randint(0, 262144, (1, 16))
    with torch.no_grad():
        want = copy.deepcopy(model).double()(ids).logits
    before = (embed.weight.data_ptr(), embed.weight.shape, embed.embed_scale.dtype)
    monkeypatch.setattr(fp64, "BLOCK", 8 << 20)  # the output layer: 8 MB of rows at once
    got: list = []
    peak = _cpu_peak(lambda: got.append(fp64_reference(model, Inputs(args=[ids], kwargs={}))))
    (logits,) = [
        t for t in got[0].leaves.values() if isinstance(t, torch.Tensor) and t.shape == want.shape
    ]
    torch.testing.assert_close(logits, want, rtol=1e-12, atol=1e-12)
    table = embed.weight.numel() * 8  # 134 MB; the logits in float64 are 34 MB
    assert peak is not None and peak < table / 2, (peak, table)
    assert (embed.weight.data_ptr(), embed.weight.shape, embed.embed_scale.dtype) == before
    assert embed.weight.dtype == torch.float32 and "forward" not in vars(embed)


class _Scaled(torch.nn.Embedding):
    """An embedding subclass as stock models write one: its rows times a scale it holds,
    cast to the weight's dtype; ``peek`` also reads the weight's values directly."""

    def __init__(self, peek: bool = False) -> None:
        super().__init__(64, 8, padding_idx=3)
        self.register_buffer("scale", torch.tensor(2.0**0.5))
        self.peek = peek

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = super().forward(input_ids) * self.scale.to(self.weight.dtype)
        return out + self.weight.sum() if self.peek else out


class _Called(torch.nn.Module):
    def __init__(self, peek: bool) -> None:
        super().__init__()
        self.emb, self.head = _Scaled(peek), torch.nn.Linear(8, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(input_ids=ids))  # by keyword


@pytest.mark.parametrize("peek", [False, True])
def test_an_embedding_subclass_called_by_keyword_or_reading_its_weight(monkeypatch, peek):
    """A large embedding subclass's lookup is taken from its own fp32 table and cast,
    whatever way it is called (here by keyword) and whatever its forward does with the
    weight's dtype (the scale, cast to it, is float64 as in the float64 copy): the same
    numbers as the copy's. One that reads its weight's values otherwise (``peek``) gets
    the whole table in float64 for that read: the copy's numbers too, never fp32 ones."""
    from gatekeeper.worker import fp64, parity

    torch.manual_seed(0)
    model = _Called(peek).eval()
    ids = torch.randint(0, 64, (2, 5))
    with torch.no_grad():
        want = copy.deepcopy(model).double()(ids)
    monkeypatch.setattr(fp64, "BLOCK", 8 * 8)  # the 64 x 8 table is "large"
    monkeypatch.setattr(parity, "COPY_LIMIT", 0)  # no whole-model copy to fall back on
    assert fp64._by_parts(model.emb) is not None
    got = fp64_reference(model, Inputs(args=[ids], kwargs={}))
    assert got is not None
    (leaf,) = got.leaves.values()
    assert leaf.dtype == torch.float64
    torch.testing.assert_close(leaf, want, rtol=1e-12, atol=1e-12)  # the head: by blocks
    assert model.emb.weight.dtype == torch.float32 and model.emb.scale.dtype == torch.float32
    assert model.emb.weight.shape == (64, 8)


def test_a_large_leaf_is_compared_a_chunk_at_a_time_with_the_same_figures():
    """The logits of a 152k-word vocabulary (Qwen2: 1 x 128 x 151936 in float32, 78 MB)
    against eager's: the comparison's figures are those of the leaf compared whole in
    float64, and its float64 temporaries are a chunk's (8 MiB each), not the leaf's
    (155 MB each: four of them at once, over 0.6 GB, made a Qwen2-0.5B check 1.95x its
    weights; issue 53). Memory by the profiler's allocation events, not by time."""
    from gatekeeper.worker.memory import peak_memory

    g = torch.Generator().manual_seed(0)
    o = torch.randn(1, 128, 151936, generator=g)
    c = o + 1e-5 * torch.randn(o.shape, generator=g)  # within allclose
    result = check_parity(Outputs.of({"logits": c}), Outputs.of({"logits": o}), None, TOL)
    assert result["passed"] and result["method"] == "allclose", result
    d = c.double() - o.double()
    assert result["max_abs_err"] == pytest.approx(d.abs().max().item(), rel=1e-12)
    assert result["rmse"] == pytest.approx(d.pow(2).mean().sqrt().item(), rel=1e-9)
    whole = torch.nn.functional.cosine_similarity(c.double().flatten(), o.double().flatten(), 0)
    assert result["cosine"] == pytest.approx(whole.item(), rel=1e-12)
    del d, whole
    far = o.clone()
    far[0, 7, 100] += 1.0  # one logit off: allclose refuses, named with its |diff|
    failed = check_parity(Outputs.of({"logits": far}), Outputs.of({"logits": o}), None, TOL)
    assert not failed["passed"] and "['logits']: max |diff| 1 beyond" in failed["detail"], failed
    peak = peak_memory(
        lambda: check_parity(Outputs.of({"logits": c}), Outputs.of({"logits": o}), None, TOL),
        "cpu",
    )
    assert peak is not None and peak <= 64 << 20, peak  # a few 8 MiB chunks, not 0.6 GB


class _Watched(torch.nn.Module):
    """A linear layer that notes, each time it runs in float64 (the reference), whether
    the eager outputs it was given to watch are still alive."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 4)
        self.eager_out: list = []
        self.seen: list[bool] = []

    def forward(self, x):
        if x.dtype == torch.float64:
            self.seen.append(any(ref() is not None for ref in self.eager_out))
        return self.linear(x)


def test_the_fp64_reference_runs_after_eagers_outputs_are_gone_unless_a_leaf_needs_it():
    """A Qwen2-0.5B check held eager's logits (78 MB), the compiled ones (78 MB) and
    the float64 ones (156 MB) at once: its highest point (docs/scale.md). Where
    allclose decides every leaf, the float64 reference is computed after eager's
    outputs are dropped; where one needs its RMSE rung, while they are still there."""
    import weakref

    model = _Watched()

    def eager(*args):
        out = model(*args)
        model.eager_out.append(weakref.ref(out))
        return out

    with torch.no_grad():
        out = model.linear(*INPUTS_LINEAR.args)
    got, ref64 = vs_eager(Outputs.of(out), eager, model, INPUTS_LINEAR, None, "cpu", TOL)
    assert got["method"] == "allclose" and model.seen == []  # not computed while comparing
    reference = ref64.value()
    assert model.seen == [False]  # eager's outputs were gone by then
    assert reference is not None and reference.leaves["output"].dtype == torch.float64
    assert ref64.value() is reference  # computed once

    model.seen.clear()
    near = out + 1e-3 * out.abs().mean()  # beyond allclose: its RMSE rung reads the reference
    got, ref64 = vs_eager(Outputs.of(near), eager, model, INPUTS_LINEAR, None, "cpu", TOL)
    assert model.seen == [True] and got["method"] in ("fp64-rmse", "failed")
    assert ref64.value() is not None and model.seen == [True]


def test_a_stored_references_float64_leaves_are_read_only_when_a_leaf_needs_them(tmp_path):
    """The baseline's reference file is mapped (``mmap``), so its float64 leaves, twice
    its compiled ones' bytes, come into memory only if a comparison reads them."""
    path = tmp_path / "ref.pt"
    save_reference(str(path), Outputs.of({"logits": A}), Outputs.of({"logits": A.double()}))
    loaded, fp64 = load_reference(str(path))
    assert fp64 is not None
    (leaf,) = fp64.values()
    inode = str(path.stat().st_ino)
    at = leaf.untyped_storage().data_ptr()
    assert any(m.lo <= at < m.hi and m.file[1] == inode for m in file_mappings())  # not a copy
    assert check_parity(Outputs.of({"logits": A}), loaded, fp64, TOL)["passed"]
    legacy = tmp_path / "legacy.pt"  # torch's format before zip files: read whole
    torch.save(
        {"compiled": [A], "fp64": [A.double()]}, legacy, _use_new_zipfile_serialization=False
    )
    old, old64 = load_reference(str(legacy))
    assert check_parity(Outputs.of((A,)), old, old64, TOL)["passed"]
