"""The scratch projects the real-size benchmarks write (benchmarks/scale.py for each
architecture, benchmarks/generate.py for its generate target) hold a factory that builds
the model they name: generate.py's once failed on scale.py's factory template after
that template gained the architecture's classes (`KeyError: 'config_cls'`), and only a
run at real size, many minutes in, would have said so."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import pytest
from support.helpers import load_file

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def scale():
    return load_file("scale_bench", ROOT / "benchmarks" / "scale.py")


def built(repo: Path, name: str):
    """The model ``make()`` of ``repo/scale_model.py`` returns."""
    module = load_file(f"scale_model_{name}", repo / "scale_model.py")
    return module.make()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_scale_writes_a_factory_of_each_architecture(scale, arch, tmp_path):
    repo = scale.scratch(tmp_path, "tiny", "float32", 1.0, arch=arch)
    model = built(repo, arch)
    config_cls, model_cls, tied, sizes = scale.ARCHS[arch]
    assert type(model).__name__ == model_cls
    assert model.config.vocab_size == sizes["tiny"]["vocab_size"]
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert (embed.data_ptr() == head.data_ptr()) is tied


@pytest.mark.parametrize("strategy", ["whole", "regional"])
def test_generate_writes_a_generate_target_of_the_scale_model(scale, strategy, tmp_path):
    gen = load_file("generate_bench", ROOT / "benchmarks" / "generate.py")
    args = argparse.Namespace(
        dtype="fp32",
        device="cpu",
        min_time=1.0,
        max_time=None,
        prompt=8,
        new_tokens=4,
        mode="default",
        strategy=strategy,
    )
    repo = tmp_path / "project"
    gen.project(repo, scale.SIZES["tiny"], args)
    model = built(repo, "generate")
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.hidden_size == scale.SIZES["tiny"]["hidden_size"]
    config = tomllib.loads((repo / "gatekeeper.toml").read_text())
    (lm,) = config["models"]
    assert lm["tasks"] == ["generate"] and lm["generate"] == {"new_tokens": 4}
    assert lm["strategies"] == [strategy]
    assert lm["inputs"]["input_ids"]["high"] == scale.SIZES["tiny"]["vocab_size"]
    # the service it times on the warmed dir: valid Python, the target's generation
    service = (repo / "service.py").read_text()
    compile(service, "service.py", "exec")
    assert "max_new_tokens=4" in service and "(1, 8)" in service
    # compiled as the target is: its forward whole, or its layers in place
    assert ("layer.compile(mode='default')" in service) == (strategy == "regional")
    assert ("torch.compile(model.forward" in service) == (strategy == "whole")
