"""Stock transformers causal LMs as they are, in the minimal ``generate`` form
(docs/generation.md), through every step a user runs, with the public tools only.

For each family (a tiny config, random weights, ``.eval()``, the model as the library
returns it), in a scratch git project of its own holding ``lm.py`` (``make_lm``) and the
minimal config with the local store:

    compile    gatekeeper compile: the bundle published
    warm       gatekeeper warm --probe into an empty cache dir: ``hit``, 0 FX misses
    service    docs/generation.md's "A service that starts warm" block, as the page
               shows it, in a fresh interpreter on that cache dir: 0 FX graph misses
    check      gatekeeper check: parity by tokens, TTFT, TPOT, decode tokens/s
    baseline   gatekeeper baseline: main's results published
    pr         a branch whose factory only gains a comment, ``gatekeeper run
               --base-ref main`` (paired with main): an unchanged PR's verdict

Prints a table, family x step, with the figures; exit 1 when any step failed.

Usage, from the repo root:

    python benchmarks/generate_families.py [--families llama,qwen2,mistral,gpt2]
        [--new-tokens 16] [--strategy whole|regional|aot] [--layers N] [--timeout 1800]
        [--keep DIR] [--json PATH]

``--strategy regional`` makes each target regional and runs docs/generation.md's
regional service block (the family's layers in place of ``model.model.layers``); a
regional target needs two layers or more (``--layers``; ten pass Dynamo's default
recompile limit of 8 graphs). ``--strategy aot`` exports each family's static-cache
forward (a family torch.export refuses is ``not-exportable``, its reason in the JSON);
it is checked before it is warmed (warm serves only a package a check verified), its
warm step asks for the package served, its service step runs docs/generation.md's
deploy block ("An AOTInductor generation"): the new tokens made without inductor.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("compile", "warm", "service", "check", "baseline", "pr")

FAMILIES = {
    "llama": (
        "LlamaConfig, LlamaForCausalLM",
        "LlamaConfig(vocab_size=2048, hidden_size=64, intermediate_size=128,"
        " num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,"
        " max_position_embeddings=64)",
    ),
    "qwen2": (
        "Qwen2Config, Qwen2ForCausalLM",
        "Qwen2Config(vocab_size=2048, hidden_size=64, intermediate_size=128,"
        " num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,"
        " max_position_embeddings=64)",
    ),
    "mistral": (
        "MistralConfig, MistralForCausalLM",
        "MistralConfig(vocab_size=2048, hidden_size=64, intermediate_size=128,"
        " num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,"
        " max_position_embeddings=64)",
    ),
    "gpt2": (
        "GPT2Config, GPT2LMHeadModel",
        "GPT2Config(vocab_size=2048, n_embd=64, n_layer=1, n_head=4, n_positions=64)",
    ),
    # families the sweep added later, each with what the four above lack: Phi-3's fused
    # QKV and gate-up projections, Gemma's tied and scaled embedding, GPT-NeoX's partial
    # rotary and parallel residual, OPT's learned positions offset by 2, OLMo's
    # non-parametric layer norm
    "phi3": (
        "Phi3Config, Phi3ForCausalLM",
        "Phi3Config(vocab_size=2048, hidden_size=64, intermediate_size=128,"
        " num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,"
        " max_position_embeddings=64, pad_token_id=0)",
    ),
    "gemma": (
        "GemmaConfig, GemmaForCausalLM",
        "GemmaConfig(vocab_size=2048, hidden_size=64, intermediate_size=128,"
        " num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,"
        " max_position_embeddings=64)",
    ),
    "gpt_neox": (
        "GPTNeoXConfig, GPTNeoXForCausalLM",
        "GPTNeoXConfig(vocab_size=2048, hidden_size=64, intermediate_size=128,"
        " num_hidden_layers=1, num_attention_heads=4, max_position_embeddings=64)",
    ),
    "opt": (
        "OPTConfig, OPTForCausalLM",
        "OPTConfig(vocab_size=2048, hidden_size=64, ffn_dim=128, num_hidden_layers=1,"
        " num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=64)",
    ),
    "olmo": (
        "OlmoConfig, OlmoForCausalLM",
        "OlmoConfig(vocab_size=2048, hidden_size=64, intermediate_size=128,"
        " num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,"
        " max_position_embeddings=64, pad_token_id=0)",
    ),
    # a third wave: Gemma 2's logit soft-capping and Gemma 3's q/k norms, each with
    # sliding-window layers between global ones (two layers, a 16-token window: a hybrid
    # cache), Qwen 3's q/k norms, Mixtral's mixture of experts (top-2 of 4 routed per
    # token), Falcon's parallel attention and multi-query heads, GPT-BigCode's multi-query
    # attention with fused KV
    "gemma2": (
        "Gemma2Config, Gemma2ForCausalLM",
        "Gemma2Config(vocab_size=2048, hidden_size=64, intermediate_size=128,"
        " num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,"
        " max_position_embeddings=64, sliding_window=16)",
    ),
    "gemma3": (
        "Gemma3TextConfig, Gemma3ForCausalLM",
        "Gemma3TextConfig(vocab_size=2048, hidden_size=64, intermediate_size=128,"
        " num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=16,"
        " max_position_embeddings=64, sliding_window=16)",
    ),
    "qwen3": (
        "Qwen3Config, Qwen3ForCausalLM",
        "Qwen3Config(vocab_size=2048, hidden_size=64, intermediate_size=128,"
        " num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,"
        " max_position_embeddings=64)",
    ),
    "mixtral": (
        "MixtralConfig, MixtralForCausalLM",
        "MixtralConfig(vocab_size=2048, hidden_size=64, intermediate_size=128,"
        " num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,"
        " num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64)",
    ),
    "falcon": (
        "FalconConfig, FalconForCausalLM",
        "FalconConfig(vocab_size=2048, hidden_size=64, num_hidden_layers=1,"
        " num_attention_heads=4, max_position_embeddings=64)",
    ),
    "gpt_bigcode": (
        "GPTBigCodeConfig, GPTBigCodeForCausalLM",
        "GPTBigCodeConfig(vocab_size=2048, n_embd=64, n_layer=1, n_head=4, n_positions=64)",
    ),
}
FACTORY = '''from transformers import {imports}


def make_lm():
    """A stock {cls}, one layer, random weights, as the library returns it."""
    return {cls}({config}).eval()
'''
CONFIG = """store = "store"

[[models]]
name = "lm"
factory = "lm:make_lm"
inputs = {{ input_ids = {{ shape = [1, 32], dtype = "int64", high = 2048 }} }}
tasks = ["generate"]
generate = {{ new_tokens = {new_tokens} }}
strategies = ["{strategy}"]
"""
# where each family keeps its decoder layers (the regional service block's
# ``model.model.layers``), where that is not Llama's
LAYERS = {
    "gpt2": "model.transformer.h",
    "gpt_bigcode": "model.transformer.h",
    "falcon": "model.transformer.h",
    "gpt_neox": "model.gpt_neox.layers",
    "opt": "model.model.decoder.layers",
}
# the service block of each strategy: docs/generation.md's section that shows it
SERVICE = {
    "whole": "## A service that starts warm",
    "regional": "### A regional generation",
    "aot": "### An AOTInductor generation",
}
# after the aot deploy block: the tokens it made, and whether inductor was imported
AOT_SEEN = (
    "\nimport json, sys\n"
    "print(json.dumps({'tokens': generated.shape[1], "
    "'inductor': 'torch._inductor' in sys.modules}))\n"
)


def _zoo() -> Any:
    """benchmarks/zoo.py's helpers (git, the CLI with --json, its results)."""
    spec = importlib.util.spec_from_file_location("zoo_bench", ROOT / "benchmarks" / "zoo.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


zoo = _zoo()


def service_code(new_tokens: int, strategy: str, family: str) -> str:
    """docs/generation.md's service block of the strategy as the page shows it (its 16
    new tokens set to the sweep's; a regional block's layers where the family keeps
    them), then torch's inductor counters printed as JSON."""
    text = (ROOT / "docs" / "generation.md").read_text()
    section = text.split(SERVICE[strategy], 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, "docs/generation.md: no service block"
    code = found.group(1).replace("max_new_tokens=16", f"max_new_tokens={new_tokens}")
    code = code.replace("model.model.layers", LAYERS.get(family, "model.model.layers"))
    if strategy == "aot":
        return code.replace("range(15)", f"range({new_tokens - 1})") + AOT_SEEN
    return code + (
        "\nimport json\nfrom torch._dynamo.utils import counters\n"
        "print(json.dumps(dict(counters['inductor'])))\n"
    )


def project(name: str, args: argparse.Namespace, where: Path) -> Path:
    """A scratch git project (branch main) with the family's factory and the minimal
    config (its ``strategies``, the factory's layers ``--layers`` where given)."""
    imports, config = FAMILIES[name]
    if args.layers is not None:
        config = re.sub(r"\b(num_hidden_layers|n_layer)=\d+", rf"\1={args.layers}", config)
    repo = where / name
    repo.mkdir(parents=True)
    cls = imports.split(", ")[1]
    factory = FACTORY.format(imports=imports, cls=cls, config=config)
    if args.layers is not None:
        factory = factory.replace("one layer,", f"{args.layers} layers,")
    (repo / "lm.py").write_text(factory)
    toml = CONFIG.format(new_tokens=args.new_tokens, strategy=args.strategy)
    (repo / "gatekeeper.toml").write_text(toml)
    (repo / ".gitignore").write_text("store/\nout/\nwarm/\n.gatekeeper/\n")
    zoo.git(repo, "init", "-q", "-b", "main")
    zoo.git(repo, "add", ".")
    zoo.git(repo, "commit", "-qm", "main")
    return repo


def sweep(name: str, repo: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Every step of one family: ``steps`` (step -> "ok" or why not) and the figures."""
    steps: dict[str, str] = {}
    fig: dict[str, Any] = {"family": name, "steps": steps}
    timeout = args.timeout

    def cli(*args: str) -> tuple[int, dict, str]:
        return zoo.gk(repo, "gatekeeper.toml", *args, target="lm/*", timeout=timeout)

    rc, doc, err = cli("compile")
    t = zoo._first(doc)
    ok = rc == 0 and t.get("status") in ("published", "exists", "replaced")
    steps["compile"] = "ok" if ok else (t.get("error") or err or f"exit {rc}")
    fig["compile_s"] = t.get("compile_seconds")

    def warm_and_serve() -> None:
        rc, doc, err = cli("warm", "--probe", "--cache-dir", str(repo / "warm"))
        t = zoo._first(doc)
        fig["warm_fx"] = f"{t.get('fxgraph_cache_hit')}/{t.get('fxgraph_cache_miss')}"
        fig["warm_first_token_s"] = t.get("first_token_seconds")
        ok = rc == 0 and t.get("status") == "hit" and not t.get("probe_error")
        if args.strategy == "aot":  # no FX graph: its package served and loaded
            fig["warm_fx"] = t.get("aot")
            ok = ok and t.get("aot") == "served" and t.get("dynamo") == "skipped"
        else:
            ok = ok and t.get("fxgraph_cache_miss") == 0
        steps["warm"] = "ok" if ok else f"{t.get('status')}: {t.get('probe_error') or err}"

        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(repo / "warm")}
        cmd = [sys.executable, "-c", service_code(args.new_tokens, args.strategy, name)]
        try:
            ran = subprocess.run(
                cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout
            )
            lines = ran.stdout.strip().splitlines()
            found = json.loads(lines[-1]) if ran.returncode == 0 and lines else {}
            why = (ran.stderr.strip().splitlines() or ["no counters"])[-1]
        except subprocess.TimeoutExpired:
            found, why = {}, f"timed out after {timeout:.0f} s"
        if args.strategy == "aot":
            made = found.get("tokens") == args.new_tokens and found.get("inductor") is False
            fig["service_fx"] = f"{found.get('tokens')} tokens" if found else None
            steps["service"] = "ok" if made else (json.dumps(found) if found else why)
        else:
            hit, miss = found.get("fxgraph_cache_hit", 0), found.get("fxgraph_cache_miss", 0)
            fig["service_fx"] = f"{hit}/{miss}" if found else None
            ok = found and miss == 0 and hit
            steps["service"] = "ok" if ok else (f"{hit}/{miss}" if found else why)

    def check() -> None:
        rc, doc, err = cli("check", "--out", "out/main")
        r = zoo._result(repo / "out/main/results.json") or {}
        parity = (r.get("parity") or {}).get("vs_eager") or {}
        gen = (r.get("generation") or {}).get("compiled") or {}
        fig.update(
            parity=parity.get("detail"),
            ttft_ms=gen.get("ttft_s") and 1e3 * gen["ttft_s"],
            tpot_ms=gen.get("tpot_s") and 1e3 * gen["tpot_s"],
            tokens_per_s=gen.get("tokens_per_s"),
            decode_recompiles=(r.get("generation") or {}).get("decode_recompiles"),
        )
        ok = r.get("status") == "ok" and parity.get("passed") and gen.get("tpot_s")
        why = r.get("error") or parity.get("detail") or err
        if ok and fig["decode_recompiles"]:  # after warm-up, any recompile is a regression
            ok, why = False, f"{fig['decode_recompiles']} recompiles during decode"
        steps["check"] = "ok" if ok else why

    # an aot target's package is served only once a check verified it
    for step in (check, warm_and_serve) if args.strategy == "aot" else (warm_and_serve, check):
        step()

    if (repo / "out/main/results.json").is_file():
        rc, _, err = cli("baseline", "--results", "out/main/results.json", "--ref", "main")
        steps["baseline"] = "ok" if rc == 0 else (err or f"exit {rc}")
    else:
        steps["baseline"] = "no results to publish"

    zoo.git(repo, "checkout", "-qb", "pr")
    lm = repo / "lm.py"
    lm.write_text(lm.read_text() + "\n# a pull request that changes nothing\n")
    zoo.git(repo, "commit", "-qam", "pr: a comment")
    rc, doc, err = cli("run", "--base-ref", "main", "--out", "out/pr")
    t = zoo._first(doc)
    fig["pr"] = f"{t.get('verdict')} ({t.get('mode')})" if t else None
    if rc == 0 and t.get("verdict") in zoo.PR_OK:
        steps["pr"] = "ok"
    else:
        steps["pr"] = "; ".join(t.get("reasons") or []) or t.get("error") or err or f"exit {rc}"
    return fig


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(rows: list[dict[str, Any]]) -> str:
    body = [
        [
            r["family"],
            *["ok" if r["steps"].get(s) == "ok" else "FAIL" for s in STEPS],
            r.get("warm_fx") or "-",
            r.get("service_fx") or "-",
            _num(r.get("ttft_ms"), ".1f"),
            _num(r.get("tpot_ms"), ".2f"),
            _num(r.get("tokens_per_s"), ".0f"),
            r.get("pr") or "-",
        ]
        for r in rows
    ]
    headers = [
        "family",
        *STEPS,
        "warm FX hit/miss",
        "service FX hit/miss",
        "TTFT ms",
        "TPOT ms",
        "tokens/s",
        "unchanged PR",
    ]
    return tabulate(body, headers=headers, tablefmt="github")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--strategy", choices=sorted(SERVICE), default="whole")
    ap.add_argument("--layers", type=int, help="each factory's layers (default: its own)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per command")
    ap.add_argument("--keep", metavar="DIR", help="the scratch projects here (kept)")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = ap.parse_args()
    names = [n for n in args.families.split(",") if n]
    if unknown := [n for n in names if n not in FAMILIES]:
        ap.error(f"--families: unknown {', '.join(unknown)} (of {', '.join(FAMILIES)})")
    where = Path(args.keep or tempfile.mkdtemp(prefix="gk-genfam-"))
    rows = []
    for name in names:
        start = time.perf_counter()
        repo = project(name, args, where)
        rows.append(sweep(name, repo, args))
        rows[-1]["seconds"] = round(time.perf_counter() - start)
        print(f"[{name}] {rows[-1]['steps']} ({rows[-1]['seconds']} s)", file=sys.stderr)
    print(table(rows))
    for r in rows:
        for step, why in r["steps"].items():
            if why != "ok":
                print(f"{r['family']} {step}: {why}")
        if r.get("parity"):
            print(f"{r['family']} parity: {r['parity']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, default=str))
    print(f"\n{where}; {sys.executable}")
    return 0 if all(v == "ok" for r in rows for v in r["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
