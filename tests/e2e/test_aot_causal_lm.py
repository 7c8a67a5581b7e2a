"""A stock transformers causal LM through the ``aot`` strategy as it is (issue 43): no
``use_cache = false`` in the config (its KV cache is left out of what export sees, and
the report says so), its package built without its weights (``export.weights =
"bound"``), checked with the model's own weights bound, and loaded by
``gatekeeper.load_aot`` in a fresh process that imported nothing but gatekeeper and
torch (the output type, transformers' ``CausalLMOutputWithPast``, restored by importing
its module), on the deploy's weights; and an unchanged pull request checked paired,
where both sides' weights move halfway through the timed rounds (issue 53). One
compile and one check for the module."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.helpers import git, gk, gk_json, unchanged_passes, write_project

pytest.importorskip("transformers")

MODEL = textwrap.dedent("""
    from transformers import LlamaConfig, LlamaForCausalLM


    def make():
        # a 32k vocabulary (8 MB of tied embedding): more weights than the package's code
        config = LlamaConfig(
            vocab_size=32000, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
        )
        return LlamaForCausalLM(config)
""")

CONFIG = textwrap.dedent("""
    [tool.gatekeeper]
    store = "store"
    precompile = "off"

    [tool.gatekeeper.measure]
    warmup = 1
    min_time = 0.1
    max_time = 0.2  # paired: no timing is judged here, only that the rounds run

    [[tool.gatekeeper.models]]
    name = "llama"
    factory = "tinymodel:make"
    inputs = [{ shape = [1, 16], dtype = "int64", high = 32000 }]
    strategies = ["aot"]
    export = { weights = "bound" }
    pass_env = ["MALLOC_MMAP_THRESHOLD_"]  # the paired test's: see there
""")

AOT = "llama/fixed/default+aot"

# in the deploy's process: its model (seeded as the check built it), the package loaded
# bound to it, the outputs of both, its state dict for a process without transformers
DEPLOY = textwrap.dedent("""
    import sys
    import torch
    import gatekeeper
    import tinymodel

    torch.manual_seed(0)
    model = tinymodel.make().eval()
    ids = torch.randint(0, 32000, (1, 16))
    package = gatekeeper.load_aot("gatekeeper.toml", {target!r}, cache_dir={deploy!r}, model=model)
    with torch.no_grad():
        eager = model(ids, use_cache=False).logits
        out = package(ids)
        assert package.weights == "bound", package
        assert torch.allclose(out.logits, eager, atol=1e-4), (out.logits - eager).abs().max()
        model.lm_head.weight.mul_(2)  # bound in place, no copy: the package sees it
        assert torch.allclose(package(ids).logits, model(ids, use_cache=False).logits, atol=1e-4)
        model.lm_head.weight.div_(2)
        model.lm_head.weight.data = model.lm_head.weight.data.clone()  # moved: old freed
        package.rebind()  # or the package reads the freed memory (unmapped: SIGSEGV)
        assert torch.allclose(package(ids).logits, eager, atol=1e-4)
    state = {{k: v for k, v in model.state_dict().items()}}
    torch.save({{"ids": ids, "logits": eager, "state": state}}, "deploy.pt")
    print("ok")
""")

# a fresh process: nothing but gatekeeper and torch, the weights from a checkpoint
FRESH = textwrap.dedent("""
    import sys
    import torch
    import gatekeeper

    saved = torch.load("deploy.pt")
    assert not any(m.startswith("transformers") for m in sys.modules)
    package = gatekeeper.load_aot("gatekeeper.toml", {target!r}, cache_dir={deploy!r},
                                  weights=saved["state"])
    out = package(saved["ids"])
    assert type(out).__module__ == "transformers.modeling_outputs", type(out)
    assert type(out).__name__ == "CausalLMOutputWithPast", type(out)
    assert torch.allclose(out.logits, saved["logits"], atol=1e-4)
    assert "torch._inductor" not in sys.modules, "load_aot imported inductor"
    try:
        gatekeeper.load_aot("gatekeeper.toml", {target!r}, cache_dir={deploy!r})
    except gatekeeper.runtime.UsageError as e:
        print(e)
""")


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> Path:
    """The project compiled and checked: its package verified with the weights bound."""
    root = write_project(tmp_path_factory.mktemp("causal_lm") / "project", MODEL, CONFIG)
    (root / ".gitignore").write_text("store/\nout*/\n.gatekeeper/\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "the model")
    (entry,) = gk_json("compile", cwd=root)["targets"]
    assert entry["status"] == "published", entry
    proc = gk("check", "--out", "out", cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def _run(code: str, root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300
    )


def test_a_stock_causal_lm_exports_as_it_is_and_its_package_holds_no_weights(checked: Path):
    (result,) = json.loads((checked / "out" / "results.json").read_text())["targets"]
    assert result["status"] == "ok" and result["parity"]["vs_eager"]["passed"], result
    aot = result["aot"]
    assert aot["verified"] is True and aot["weights"] == "bound", aot
    assert aot["note"] and "use_cache=False" in aot["note"], aot
    # the package is code only: smaller than the 8 MB of weights it is bound to
    assert aot["weight_bytes"] > 8_000_000 and aot["bytes"] < aot["weight_bytes"] / 2, aot
    gk("gate", "--results", "out/results.json", cwd=checked, check=True)
    report = (checked / "out" / "report.md").read_text()
    assert "weights" in report and "bound at load" in report and "use_cache=False" in report


def test_load_aot_binds_the_deploys_weights_and_restores_the_output_type(
    checked: Path, tmp_path: Path
):
    deploy = tmp_path / "deploy"
    (warmed,) = gk_json("warm", "--cache-dir", str(deploy), "--target", AOT, cwd=checked)["targets"]
    assert warmed["aot"] == "served", warmed
    proc = _run(DEPLOY.format(target=AOT, deploy=str(deploy)), checked)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
    proc = _run(FRESH.format(target=AOT, deploy=str(deploy)), checked)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # without the deploy's weights: one line saying what to pass
    assert "pass the deploy's own" in proc.stdout and "model=" in proc.stdout, proc.stdout


def test_an_unchanged_pull_request_is_checked_paired_on_weights_placed_again(checked: Path):
    """Paired, both sides' weights are copied into new memory halfway through the timed
    rounds (so that neither side always draws on the allocator first); a package bound
    to them keeps each weight's address from when it was bound (AOTInductor's constant
    handles), so each side's package is bound again there. Before, both read the freed
    copies: "worker died by SIGSEGV (segmentation fault) in measure" where those were
    unmapped (issue 53). glibc's mmap threshold fixed at 64 KiB makes the embedding (8
    MB, which the package's fused embedding kernel reads at the address it was bound
    at) its own mapping, unmapped when freed: a package not bound again dies for sure."""
    git(checked, "checkout", "-qb", "pr")
    (checked / "NOTES.md").write_text("a pull request that changes no code\n")
    git(checked, "add", "NOTES.md")
    git(checked, "commit", "-qm", "notes")
    try:
        proc = gk("run", "--json", "--out", "out-pr", "--base-ref", "main", "--target", AOT,
                  cwd=checked, env={"MALLOC_MMAP_THRESHOLD_": "65536"})  # fmt: skip
    finally:
        git(checked, "checkout", "-q", "main")
    assert "died" not in proc.stderr and proc.returncode in (0, 1), proc.stderr[-3000:]
    (gated,) = json.loads(proc.stdout)["targets"]
    assert gated["mode"] == "paired" and gated["status"] == "ok", gated
    assert unchanged_passes(gated), gated
