"""Generation end to end (docs/generation.md) on a stock transformers LlamaForCausalLM
built from a tiny config with random weights, as a user configures it (the minimal
form): compile publishes the prefill and decode graphs, warm restores them and a fresh
service interpreter running docs/generation.md's own code block on the warmed cache dir
compiles nothing (torch's counters: 0 FX graph misses), though the prompt gatekeeper
compiled with holds the model's pad token (the service's block passes its attention mask);
check reports TTFT, TPOT and tokens/s and passes parity by tokens; baseline publishes;
an unchanged pull request passes. Then pull requests the gate must catch: a step count
kept on a module that the output reads (every decode step recompiles: `regressed`,
naming recompiles), and a compiled decode that chooses other tokens than eager
(`parity-failed`, naming the step).

One cold compile for the module; every pull request is checked paired with main (its
base warm from main's bundle), with timing rules too wide to decide anything here (the
timing verdict is tests/e2e/test_generate_timing.py's, a serial test)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.helpers import (
    docs_code,
    git,
    gk,
    inductor_counters,
    main_branch,
    tiny_llama,
    unchanged_passes,
)

pytest.importorskip("transformers")

TARGET = "lm/fixed/default+generate"
# its pad token is one the prompt holds (every token is 0 or 1): a service's prompt
# (docs/generation.md's block: any token, the mask given) must still find its graphs
LM = tiny_llama().replace(
    "max_position_embeddings=64,", "max_position_embeddings=64, pad_token_id=0,"
)
CONFIG = """
store = "store"
precompile = "off"

[measure]
warmup = 1
min_time = 0.5
shape_sweep = false

[gate]  # timing decides nothing here
latency_regression = 0.95
speedup_regression = 0.95
ttft_regression = 0.95
tpot_regression = 0.95
tokens_per_s_regression = 0.45
compile_time_regression = 100.0
memory_regression = 100.0

[[models]]
name = "lm"
factory = "lm:make_lm"
inputs = { input_ids = { shape = [1, 32], dtype = "int64", high = 2 } }
tasks = ["generate"]
generate = { new_tokens = 16 }
"""
# a pull request's factory: the model as main builds it, then changed
CHANGED = '''

import torch


class Counting(torch.nn.Module):
    """The final norm, counting its calls in a module int that the output reads."""

    def __init__(self, norm):
        super().__init__()
        self.norm, self.calls = norm, 0

    def forward(self, x):
        self.calls += 1
        return self.norm(x) + 0 * self.calls


class Flipped(torch.nn.Module):
    """The final norm, negated in a compiled decode step: another token than eager's."""

    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, x):
        out = self.norm(x)
        if torch.compiler.is_compiling() and x.shape[1] == 1:
            return -out
        return out


def make_changed():
    model = make_lm()
    model.model.norm = {wrapper}(model.model.norm)
    return model
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """main: the minimal form, compiled and published, checked, its baseline published."""
    root = tmp_path_factory.mktemp("generate")
    ignored = "store/\nout/\nwarm/\n"
    main_branch(root, {"lm.py": LM, "gatekeeper.toml": CONFIG, ".gitignore": ignored})
    gk("compile", cwd=root, check=True)
    gk("check", "--out", "out/main", cwd=root, check=True)
    gk("baseline", "--results", "out/main/results.json", "--ref", "main", cwd=root, check=True)
    return root


def _result(root: Path, out: str) -> dict:
    return json.loads((root / out / "results.json").read_text())["targets"][0]


def test_check_reports_the_generation_and_passes_parity_by_tokens(project):
    r = _result(project, "out/main")
    assert r["status"] == "ok" and r["compile"]["cache"] == "hit", r.get("error")
    assert r["compile"]["fxgraph_cache_miss"] == 0 and r["compile"]["fxgraph_cache_hit"] == 2
    gen = r["generation"]
    assert (gen["batch"], gen["prompt"], gen["new_tokens"], gen["cache"]) == (1, 32, 16, "static")
    for side in ("compiled", "eager"):
        figures = gen[side]
        assert 0 < figures["ttft_s"] < figures["e2e_s"] and 0 < figures["tpot_s"]
        assert figures["tokens_per_s"] == pytest.approx(1 / figures["tpot_s"])
    rounds = len(r["latency"]["samples"]["compiled"])
    assert len(gen["samples"]["per_token"]) == len(gen["samples"]["first_token"]) == rounds
    assert gen["decode_recompiles"] == 0 and r["graphs"]["count"] == 2
    parity = r["parity"]["vs_eager"]
    assert parity["passed"], parity
    assert parity["detail"] == "tokens: the same 1x16 greedy tokens from 2 prompt(s)"
    assert r["memory"]["compiled_peak_bytes"] > 0


def test_warm_then_a_fresh_service_compiles_nothing(project):
    cache = project / "warm"
    proc = gk("warm", "--cache-dir", str(cache), "--probe", "--json", cwd=project, check=True)
    (t,) = json.loads(proc.stdout)["targets"]
    assert t["status"] == "hit" and t["fxgraph_cache_miss"] == 0, t
    assert 0 < t["first_token_seconds"] < t["first_call_seconds"]
    assert "first token" in proc.stderr
    # docs/generation.md's service, as it is, in a fresh interpreter on the warmed dir
    service = docs_code("generation.md", "## A service that starts warm")
    found = inductor_counters(service, project, cache)
    assert found.get("fxgraph_cache_miss", 0) == 0 and found.get("fxgraph_cache_hit") == 2, found


def _pull_request(root: Path, name: str, wrapper: str | None) -> dict:
    """A branch off main (``wrapper``: the factory wraps the final norm in it; None:
    a change of no model), checked paired with main and gated: report.json's target."""
    git(root, "checkout", "-q", "-b", name, "main")
    if wrapper is None:
        (root / "NOTES.md").write_text("A pull request that changes no model.\n")
    else:
        (root / "lm.py").write_text(LM + CHANGED.format(wrapper=wrapper))
        toml = (root / "gatekeeper.toml").read_text()
        (root / "gatekeeper.toml").write_text(toml.replace("lm:make_lm", "lm:make_changed"))
    git(root, "add", ".")
    git(root, "commit", "-qm", name)
    try:
        out = f"out/{name}"
        check = gk("check", "--base-ref", "main", "--out", out, cwd=root)
        assert check.returncode == 0 and "Traceback" not in check.stderr, check.stderr
        gate = gk(
            "gate", "--json", "--base-ref", "main", "--results", f"{out}/results.json", cwd=root
        )
        assert "Traceback" not in gate.stderr, gate.stderr
        (t,) = json.loads(gate.stdout)["targets"]
        return {**t, "exit": gate.returncode, "result": _result(root, out)}
    finally:
        git(root, "checkout", "-q", "main")


def test_an_unchanged_pull_request_passes(project):
    t = _pull_request(project, "unchanged", None)
    assert t["exit"] == 0 and unchanged_passes(t) and t["mode"] == "paired", t["reasons"]
    assert t["tpot_s"]["base"] and t["tpot_s"]["pr"] and t["timings"]["tpot"]["paired"]
    assert t["result"]["parity"]["vs_baseline"]["passed"]


def test_a_decode_that_recompiles_every_step_is_regressed_naming_recompiles(project):
    t = _pull_request(project, "recompiles", "Counting")
    assert t["exit"] == 1 and t["verdict"] == "regressed", t["reasons"]
    (said,) = [r for r in t["reasons"] if r.startswith("recompiles during decode: ")]
    assert "after the first decode step: guard failed: " in said and "calls" in said, said
    assert t["decode_recompiles"] == {
        "base": 0,
        "pr": t["result"]["generation"]["decode_recompiles"],
    }
    assert t["result"]["generation"]["decode_recompiles"] >= 5


def test_a_compiled_decode_choosing_other_tokens_is_parity_failed_naming_the_step(project):
    t = _pull_request(project, "flipped", "Flipped")
    assert t["exit"] == 1 and t["verdict"] == "parity-failed", t["reasons"]
    check = t["result"]["parity"]["vs_eager"]
    assert not check["passed"] and check["method"] == "tokens", check
    # the prefill is eager's; the first decode step (the second token) is not
    assert re.match(r"token 2 of prompt 1: compiled \d+, eager \d+ \(", check["detail"]), check
    assert any(r.startswith("parity vs eager: token 2 of prompt 1: ") for r in t["reasons"])
