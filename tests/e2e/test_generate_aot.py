"""An AOTInductor generation end to end (docs/generation.md, "Strategies" and "An
AOTInductor generation") on a stock transformers LlamaForCausalLM of two tiny layers,
built from its config with random weights: compile exports its static-cache forward and
publishes one package; check generates on the bundle's package (parity by tokens, one
program, no decode recompile) and verifies it in a fresh worker; warm serves it and
its probe makes a first generation from it; docs/generation.md's deploy block, as it
is, in a fresh interpreter on the warmed dir returns the model's own greedy tokens
without importing inductor.

Before this, ``strategies = ["aot"]`` with ``tasks = ["generate"]`` was a config error.
Two layers: the fewest that make a decoder's cache a list of layers; one export and one
AOTInductor build (about 15 s here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import (
    docs_code,
    generated_by_tokens,
    gk,
    main_branch,
    tiny_llama,
    tiny_llama_config,
)

pytest.importorskip("transformers")

TARGET = "lm/fixed/default+generate+aot"
# after the docs' block: were its tokens the model's own greedy ones (the model as
# gatekeeper builds it: seeded with the config's seed, 0), and was inductor imported?
SAME = """
import json, sys
inductor = "torch._inductor" in sys.modules
from lm import make_lm
torch.manual_seed(0)
lm = make_lm().eval()
with torch.no_grad():
    own = lm.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16,
                      min_new_tokens=16, do_sample=False)[:, prompt.shape[1]:]
print(json.dumps({"same": torch.equal(generated, own), "inductor": inductor,
                  "tokens": generated.shape[1]}))
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("generate-aot")
    files = {"lm.py": tiny_llama(layers=2), "gatekeeper.toml": tiny_llama_config('["aot"]')}
    main_branch(root, {**files, ".gitignore": "store/\nout/\nwarm/\nearly*\n"})
    gk("compile", cwd=root, check=True)
    # before any check: nothing verified, so nothing served, and the probe says so
    early = gk("warm", "--cache-dir", "early", "--probe", "--json", cwd=root, check=True)
    (root / "early.json").write_text(early.stdout)
    gk("check", "--out", "out", cwd=root, check=True)
    return root


def test_before_a_check_warm_serves_no_package_and_its_probe_says_why(project):
    (t,) = json.loads((project / "early.json").read_text())["targets"]
    assert t["status"] == "hit" and t["aot"] == "unverified", t
    assert t["probe_error"].startswith("no AOTInductor package installed here"), t


def test_an_aot_generation_is_one_verified_package_with_the_eager_tokens(project):
    (r,) = json.loads((project / "out" / "results.json").read_text())["targets"]
    gen = generated_by_tokens(r, TARGET, graphs=1)  # one exported program
    assert gen["cache"] == "static", gen
    aot = r["aot"]
    assert aot["from"] == "bundle" and aot["verified"] is True and aot["now"], aot


def test_warm_serves_it_and_the_docs_deploy_generates_the_models_tokens(project):
    cache = project / "warm"
    proc = gk("warm", "--cache-dir", str(cache), "--probe", "--json", cwd=project, check=True)
    (t,) = json.loads(proc.stdout)["targets"]
    assert t["status"] == "hit" and t["aot"] == "served", t
    # the probe's first generation on the package, as a deploy's: no Dynamo, no inductor
    assert t["dynamo"] == "skipped" and t["inductor_imported"] is False, t
    assert 0 < t["first_token_seconds"] <= t["first_call_seconds"], t
    code = docs_code("generation.md", "### An AOTInductor generation") + SAME
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    ran = subprocess.run(
        [sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    found = json.loads(ran.stdout.strip().splitlines()[-1])
    assert found == {"same": True, "inductor": False, "tokens": 16}, found
