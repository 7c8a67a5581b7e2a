"""Outputs of any structure, as stock models return them: transformers' ModelOutputs and
cache classes, dataclasses, named tuples, None and scalars are walked leaf by leaf;
parity names the leaf that differs; reference files hold only plain data; what cannot
be read is an error naming the type and the path. Real transformers models, run eagerly
(their compiled runs: tests/e2e/test_zoo.py)."""

from __future__ import annotations

import copy
import dataclasses
from typing import NamedTuple

import pytest
import torch
from support.helpers import stock_lm

from gatekeeper.config import ParityTolerance
from gatekeeper.worker.calls import Inputs
from gatekeeper.worker.outputs import Outputs, UnreadableOutput
from gatekeeper.worker.parity import check_parity, load_reference, save_reference

transformers = pytest.importorskip("transformers")

TOL = ParityTolerance(atol=1e-4, rtol=1e-4, cosine=0.99)


def _llama(layers: int = 2):
    torch.manual_seed(0)
    return stock_lm(layers=layers, vocab=64, hidden=32, heads=4)


IDS = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def lm_out():
    with torch.no_grad():
        return _llama()(IDS)


def _cache_of(out):
    """The cache of a causal LM's output, whatever transformers calls its key."""
    return next(v for v in out.values() if isinstance(v, transformers.Cache))


def test_a_causal_lms_cache_is_walked_to_each_layers_tensors(lm_out):
    out = Outputs.of(lm_out)
    key = next(k for k, v in lm_out.items() if isinstance(v, transformers.Cache))
    for layer in (0, 1):
        for part in ("keys", "values"):
            leaf = out.leaves[f"output[{key!r}].layers[{layer}].{part}"]
            assert isinstance(leaf, torch.Tensor) and leaf.shape[0] == 1
    assert out.structure[f"output[{key!r}]"].startswith("DynamicCache(")
    assert check_parity(Outputs.of(lm_out), Outputs.of(copy.deepcopy(lm_out)), None, TOL)["passed"]


def test_one_changed_cache_layer_fails_naming_its_leaf(lm_out):
    changed = copy.deepcopy(lm_out)
    cache = _cache_of(changed)
    cache.layers[1].values = cache.layers[1].values * 1.5
    got = check_parity(Outputs.of(changed), Outputs.of(lm_out), None, TOL)
    assert not got["passed"] and got["method"] == "failed"
    assert ".layers[1].values" in got["detail"] and ".layers[0]" not in got["detail"]


def test_a_layer_more_a_renamed_key_or_a_changed_dtype_fails_naming_the_leaf(lm_out):
    with torch.no_grad():
        deeper = _llama(layers=3)(IDS)
    got = check_parity(Outputs.of(deeper), Outputs.of(lm_out), None, TOL)
    assert got["method"] == "structure" and ".layers: list[3], expected list[2]" in got["detail"]

    renamed = dict(lm_out)
    renamed["scores"] = renamed.pop("logits")
    got = check_parity(Outputs.of(renamed), Outputs.of(dict(lm_out)), None, TOL)
    assert got["method"] == "structure" and got["detail"].startswith("output:")

    half = copy.deepcopy(lm_out)
    _cache_of(half).layers[0].keys = _cache_of(half).layers[0].keys.half()
    got = check_parity(Outputs.of(half), Outputs.of(lm_out), None, TOL)
    assert got["method"] == "dtype" and ".layers[0].keys: dtype float16" in got["detail"]


def test_a_reference_holding_a_cache_loads_with_weights_only(tmp_path, lm_out):
    path = tmp_path / "ref.pt"
    save_reference(str(path), Outputs.of(lm_out), Outputs.of(lm_out))
    doc = torch.load(path, weights_only=True)  # no pickled object: tensors and strings
    assert any(".layers[1].keys" in k for k in doc["leaves"])
    loaded, fp64 = load_reference(str(path))
    assert check_parity(Outputs.of(lm_out), loaded, fp64, TOL)["passed"]


def test_an_ssm_cache_and_an_encoder_decoder_cache_are_read():
    torch.manual_seed(0)
    mamba = transformers.AutoModelForCausalLM.from_config(
        transformers.MambaConfig(vocab_size=64, hidden_size=32, state_size=4, num_hidden_layers=2)
    ).eval()
    t5 = transformers.T5ForConditionalGeneration(
        transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4)
    ).eval()
    with torch.no_grad():
        ssm = Outputs.of(mamba(IDS))
        seq2seq = Outputs.of(t5(input_ids=IDS, decoder_input_ids=IDS[:, :3]))
    ssm_tensors = [p for p, v in ssm.leaves.items() if isinstance(v, torch.Tensor)]
    assert any("layers[1]" in p for p in ssm_tensors) and len(ssm_tensors) > 2
    assert any(kind.startswith("EncoderDecoderCache(") for kind in seq2seq.structure.values())
    assert any("cross_attention_cache" in p for p in seq2seq.leaves)


@dataclasses.dataclass
class Pair:
    hidden: torch.Tensor
    steps: int
    note: str | None = None


class Named(NamedTuple):
    a: torch.Tensor
    b: float


def test_dataclasses_named_tuples_none_and_scalars():
    x = torch.ones(2)
    out = Outputs.of({"pair": Pair(x, 3), "named": Named(x, 0.5), "none": None, "dt": x.dtype})
    assert out.leaves["output['pair'].hidden"] is x
    assert out.leaves["output['pair'].steps"] == 3 and out.leaves["output['pair'].note"] is None
    assert out.leaves["output['named'][1]"] == 0.5
    assert out.leaves["output['dt']"] == "torch.float32"
    other = Outputs.of({"pair": Pair(x, 4), "named": Named(x, 0.5), "none": None, "dt": x.dtype})
    got = check_parity(other, out, None, TOL)
    assert not got["passed"] and got["detail"] == "output['pair'].steps: 4, expected 3"


class Opaque:
    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = torch.ones(1)


def test_an_output_it_cannot_read_is_an_error_naming_the_type_and_the_path():
    with pytest.raises(UnreadableOutput, match=r"^output\['x'\]\[0\]: cannot compare .*Opaque"):
        Outputs.of({"x": [Opaque()]})
    with pytest.raises(UnreadableOutput, match=r"^output\.model: .*Linear \(a module"):
        Outputs.of(_Holder(torch.nn.Linear(1, 1)))


class _Holder:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model


def test_inputs_factory_return_forms():
    t = torch.ones(1)
    assert Inputs.of((t, 2)) == Inputs((t, 2))
    assert Inputs.of({"x": t}).kwargs == {"x": t} and Inputs.of({"x": t}).args == ()
    both = Inputs.of(((t,), {"use_cache": False}))
    assert both.args == (t,) and both.kwargs == {"use_cache": False}
    assert Inputs.of(t).args == (t,)
    assert both.for_loss() == ((t,), {"use_cache": False})
    assert Inputs.of((t,)).for_loss() == (t,)
