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
from support.helpers import stock_lm

from gatekeeper import kinds
from gatekeeper.boundary.protocol import KindRef
from gatekeeper.config import ModelConfig
from gatekeeper.errors import ConfigError
from gatekeeper.worker.calls import Inputs
from gatekeeper.worker.compiler import snapshot_counters
from gatekeeper.worker.generate import HFLoop, OwnLoop
from gatekeeper.worker.recompiles import recompiles, start_counting

transformers = pytest.importorskip("transformers")


def _req(model: ModelConfig, kind: str = "whole") -> SimpleNamespace:
    ref = KindRef.of(kinds.get(kind))
    return SimpleNamespace(model=model, mode="default", dynamic=False, device="cpu", kind=ref)


def _lm(**extra) -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "name": "lm",
            "factory": "lm:make_lm",
            "inputs": {"input_ids": {"shape": [1, 8], "dtype": "int64", "high": 2048}},
            "tasks": ["generate"],
            "generate": {"new_tokens": 4},
            "backend": "eager",
            **extra,
        }
    )


def test_a_stock_mistral_decodes_on_a_static_cache_with_no_recompile():
    torch._dynamo.reset()
    model = _lm(
        inputs={"input_ids": {"shape": [1, 32], "dtype": "int64", "high": 2048}},
        generate={"new_tokens": 16},
    )
    # its config's sliding window (4096) makes its static cache's every layer a sliding one
    ids = Inputs(kwargs={"input_ids": torch.randint(0, 2048, (1, 32))})
    loop = HFLoop(stock_lm("Mistral"), _req(model), ids, prompt=(1, 32))  # type: ignore[arg-type]
    loop.compile()

    def at(tokens: int) -> None:
        if tokens == 2:  # the first decode step done: steady decode from here
            start_counting()

    run = loop.run(ids, at=at)
    assert len(run.gaps) == 15
    count, guards = recompiles()
    assert count == 0, guards
    loop.run(ids)  # a second generation compiles nothing either
    assert recompiles()[0] == 0


def test_a_regional_generation_keeps_a_graph_per_layer_past_dynamos_default_limit():
    """Ten layers: each is a graph of its own for the prefill and for the decode (a stock
    layer reads its own entry of the KV cache), 20 graphs of one code object, where
    Dynamo keeps 8 by default and runs the other layers eager."""
    torch._dynamo.reset()
    lm = stock_lm(layers=10, hidden=32, heads=2)
    ids = Inputs(kwargs={"input_ids": torch.randint(0, 2048, (1, 8))})
    req = _req(_lm(strategies=["regional"]), "regional")
    loop = HFLoop(lm, req, ids, prompt=(1, 8))  # type: ignore[arg-type]
    before = snapshot_counters()["graphs"]
    with torch._dynamo.config.patch(recompile_limit=8):  # the default, restored after
        loop.compile()
        compiled, eager = loop.run(ids, scores=True), loop.run(ids, compiled=False, scores=True)
    loop.checked()
    assert snapshot_counters()["graphs"] - before == 20
    assert torch.equal(compiled.tokens, eager.tokens)
    assert lm.model.layers[0]._compiled_call_impl is None  # eager runs the model as it is


def test_a_regional_generation_whose_blocks_never_run_is_a_config_error():
    """examples/tiny_models.py's TinyLM calls its layers' parts, not the layers: its
    default blocks compile nothing, and the generation says so."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    try:
        import tiny_models
    finally:
        sys.path.pop(0)
    cfg = _lm(
        strategies=["regional"],
        generate={
            "new_tokens": 4,
            "prefill": "tiny_models:prefill",
            "decode": "tiny_models:decode",
        },
        inputs={"input_ids": {"shape": [1, 8], "dtype": "int64", "high": 512}},
    )
    req = _req(cfg, "regional")
    req.base_path = Path(tiny_models.__file__).parent
    ids = Inputs(kwargs={"input_ids": torch.randint(0, 512, (1, 8))})
    loop = OwnLoop(tiny_models.tiny_lm(), req, ids, prompt=(1, 8))  # type: ignore[arg-type]
    loop.compile()
    loop.run(ids)
    with pytest.raises(ConfigError, match="layers.0, layers.1: never called by the generation"):
        loop.checked()


class _Branching(transformers.LlamaForCausalLM):
    """A stock Llama whose forward branches on its input's values: torch.compile breaks
    the graph there, torch.export refuses it."""

    def forward(self, input_ids=None, **kwargs):
        if input_ids.sum() > 0:  # the line export names
            input_ids = input_ids.clone()
        return super().forward(input_ids=input_ids, **kwargs)


def test_an_aot_generation_that_export_refuses_is_not_exportable_naming_the_line():
    """An ``aot`` generation exports the model's static-cache forward; a model torch
    refuses is ``not-exportable`` (not an error of the run) with torch's reason and the
    model's own line."""
    from pathlib import Path

    from gatekeeper.kinds.aot.worker_build import NotExportable

    base = stock_lm()
    lm = _Branching(base.config).eval()
    req = _req(_lm(strategies=["aot"], backend="inductor"), "aot")
    req.base_path = Path(__file__).parent
    ids = Inputs(kwargs={"input_ids": torch.randint(0, 2048, (1, 8))})
    loop = HFLoop(lm, req, ids, prompt=(1, 8))  # type: ignore[arg-type]
    with pytest.raises(NotExportable) as refused:
        loop.compile()
    info = refused.value.info
    assert info["exportable"] is False and info["strict"] is True, info
    source = Path(__file__).read_text().splitlines()
    assert info["file"] == Path(__file__).name, info
    assert "the line export names" in source[info["line"] - 1], info
    assert refused.value.says().startswith("not exportable: "), refused.value.says()


@pytest.mark.parametrize("arch", ["GPT2", "Llama"])
def test_an_aot_generations_loop_makes_the_tokens_of_generate(arch):
    """The loop over an aot generation's package (PackagedLM), on what the package is
    exported from: transformers' static-cache wrapper of a stock model, eager. It makes
    ``generate()``'s greedy tokens, the EOS tokens masked as ``generate()`` masks them; a
    stock GPT-2's EOS id (50256) lies outside a tiny config's 2048 words (an IndexError
    in every aot generation of such a GPT-2, before)."""
    from gatekeeper.kinds.aot.worker_generate import PackagedLM, eos_of, static_cache_module

    torch.manual_seed(0)
    if arch == "GPT2":  # its head model has another name
        config = transformers.GPT2Config(vocab_size=2048, n_embd=64, n_layer=1, n_head=4)
        lm = transformers.GPT2LMHeadModel(config).eval()
    else:
        lm = stock_lm(arch)
    ids = torch.randint(0, 2048, (1, 8))
    with torch.no_grad():
        own = lm.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=6,
            min_new_tokens=6,
            do_sample=False,
            cache_implementation="static",
        )
        step = static_cache_module(lm, batch=1, length=14)
        made = PackagedLM(step, eos_of(lm)).generate(ids, max_new_tokens=6, min_new_tokens=6)
    assert eos_of(lm) and torch.equal(made, own), (made, own)


def test_an_aot_generations_prefill_computes_the_last_positions_logits_only():
    """The exported program's LM head runs over the last position only, as
    ``generate()``'s does (``logits_to_keep=1``): a prefill over 8 tokens returns one
    position's logits (8 on the old code: the head over every prompt position, a quarter
    of a Qwen2-0.5B prefill's multiply-adds), eager's last. The model's forward is its
    own again after the export, and an instance's own ``forward`` is put back."""
    from pathlib import Path
    from types import SimpleNamespace

    from gatekeeper.kinds.aot.worker_generate import (
        export_generation,
        last_logits,
        static_cache_module,
    )

    lm = stock_lm()
    ids = torch.randint(0, 2048, (1, 8))
    module = static_cache_module(lm, batch=1, length=14)
    job = SimpleNamespace(req=SimpleNamespace(base_path=Path(__file__).parent))
    program, doc = export_generation(module, ids, 14, job)  # type: ignore[arg-type]
    assert doc["exportable"] and "forward" not in lm.__dict__
    with torch.no_grad():
        got = program.module()(input_ids=ids, cache_position=torch.arange(8))
        want = lm(ids).logits[:, -1:]
    assert got.shape == want.shape == (1, 1, 2048), got.shape
    assert torch.allclose(got, want, atol=1e-5)
    own = lm.forward
    lm.forward = own  # an instance's own forward (a hook, a wrapper)
    with last_logits(lm):
        assert lm.forward is not own
    assert lm.__dict__["forward"] is own


def test_an_aot_generation_whose_program_refuses_a_decode_step_is_not_exportable(tmp_path):
    """torch.export exports a stock tiny OPT's static-cache forward, but the program's
    runtime checks refuse a one-token decode step ("Expected u14 >= 2 but received 1"):
    the build tries a prefill and a decode step on its package, and the target is
    ``not-exportable`` saying so (its first generation raised, an error of the run,
    before). One AOTInductor build of a one-layer model."""
    from gatekeeper.kinds.aot.worker_build import NotExportable

    config = transformers.OPTConfig(
        vocab_size=2048,
        hidden_size=64,
        ffn_dim=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        word_embed_proj_dim=64,
        max_position_embeddings=64,
    )
    lm = transformers.OPTForCausalLM(config).eval()
    req = _req(_lm(strategies=["aot"], backend="inductor"), "aot")
    req.base_path = tmp_path
    req.precision = "fp32"
    ids = Inputs(kwargs={"input_ids": torch.randint(0, 2048, (1, 8))})
    loop = HFLoop(lm, req, ids, prompt=(1, 8))  # type: ignore[arg-type]
    loop.out = tmp_path / "model.pt2"
    with pytest.raises(NotExportable, match="its program refuses a decode step: ") as refused:
        loop.compile()
    assert refused.value.info["exportable"] is False, refused.value.info
