"""A plan before the work, and an out-of-memory as one line (gatekeeper.worker.plan,
gatekeeper.worker.__main__): a target too big for the memory given
(``GATEKEEPER_MEMORY_LIMIT``) is refused in one line before anything compiles, exit 2;
an out-of-memory in a stage is one line naming the stage, the run's other work kept,
never a traceback. Nothing here compiles: each worker stops before its compile."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.support.helpers import gk, parity_only_config, write_project

OOM_MODEL = textwrap.dedent("""
    import torch
    from torch import nn

    class Greedy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 4)

        def forward(self, x):
            waste = torch.empty(1 << 50, dtype=torch.uint8)  # a petabyte: refused at once
            return self.fc(x) + waste[0]

    def make():
        return Greedy()
""")


def _lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip()]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return write_project(tmp_path / "p", config=parity_only_config("[{ batch = 4 }]"))


@pytest.mark.parametrize("verb", ["compile", "check"])
def test_a_model_too_big_for_the_memory_given_is_one_line_before_any_compile(project, verb):
    """The tiny model's 2.6 KiB of weights (and its float64 reference's largest layer,
    fc1's 4.2 KiB) against a 1 KiB limit: refused before any
    compile (no bundle in the store, no results), one line naming the estimate, the
    limit and the ways out, exit 2. Before the plan the worker went on until the
    allocator failed (here it would have passed)."""
    args = [verb, "--mode", "stored"] if verb == "check" else [verb]
    proc = gk(*args, cwd=project, env={"GATEKEEPER_MEMORY_LIMIT": "1KiB"})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    last = _lines(proc.stderr)[-1]
    assert last.startswith("gatekeeper: error: tiny/b4/default: needs about 6.9 KiB: 1 x 2.6 KiB")
    assert "GATEKEEPER_MEMORY_LIMIT gives 1.0 KiB" in last, last
    assert "ways out: " in last and "tensor parallel ranks" in last, last
    assert not list((project / "store").rglob("*.tar.zst"))  # nothing compiled, nothing stored
    assert not (project / "results.json").exists()
    # under a limit it fits, the plan lets it through: tests/worker/test_plan.py


def test_a_bad_memory_limit_is_one_line(project):
    proc = gk("compile", cwd=project, env={"GATEKEEPER_MEMORY_LIMIT": "lots"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = _lines(proc.stderr)[-1]
    assert last.startswith("gatekeeper: error: GATEKEEPER_MEMORY_LIMIT: expected a size"), last


def test_an_out_of_memory_in_a_stage_is_one_line_naming_it(tmp_path):
    """A model whose forward asks for a petabyte: the allocator's refusal, in the first
    stage that calls the model (the compiled model's first call, whose trace also says
    its graphs: no explain apart), is the target's error, one line naming that stage;
    the results are written (nothing lost) and the run exits 2."""
    project = write_project(
        tmp_path / "p", model=OOM_MODEL, config=parity_only_config("[{ batch = 4 }]")
    )
    proc = gk("check", "--mode", "stored", "--json", cwd=project)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    (target,) = json.loads((project / "results.json").read_text())["targets"]
    assert target["status"] == "error"
    error = target["error"]
    assert error.startswith("out of memory in first call: ") and "\n" not in error, error
    assert any("out of memory in first call" in ln for ln in _lines(proc.stderr))


LLAMA_40B = textwrap.dedent("""
    from transformers import LlamaConfig, LlamaForCausalLM


    def make():  # 48B parameters: 180 GiB of float32 weights
        config = LlamaConfig(
            hidden_size=8192, num_hidden_layers=56, intermediate_size=28672,
            num_attention_heads=64, num_key_value_heads=8, vocab_size=32000,
        )
        return LlamaForCausalLM(config)
""")


def test_a_model_too_big_is_refused_before_its_weights_exist(tmp_path):
    """A 48B Llama factory under a 6 GiB address-space limit (``ulimit -v``), with no
    GATEKEEPER_MEMORY_LIMIT: the plan estimates on the model built on the meta device
    and refuses in one line naming the estimate and the limit, exit 2. Before, the
    worker built the model until the allocator refused ("DefaultCPUAllocator: can't
    allocate memory", no estimate; issue 50: 49 s for a 40B model under 20 GB)."""
    import resource
    import subprocess
    import sys

    pytest.importorskip("transformers")
    config = textwrap.dedent("""
        [tool.gatekeeper]
        store = "store"
        precompile = "off"

        [[tool.gatekeeper.models]]
        name = "llama"
        factory = "tinymodel:make"
        inputs = [{ shape = [1, 16], dtype = "int64", high = 32000 }]
    """)
    project = write_project(tmp_path / "p", model=LLAMA_40B, config=config)

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    proc = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "compile"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
        preexec_fn=limited,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = _lines(proc.stderr)[-1]
    assert last.startswith(
        "gatekeeper: error: llama/fixed/default: needs about 180.5 GiB: 1 x 180.5 GiB"
    ), last
    assert "the address-space limit (ulimit -v) leaves" in last, last
    assert "not built (planned on the meta device)" in last and "allocate" not in last, last
