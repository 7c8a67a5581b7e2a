"""Generation as a service runs it (docs/generation.md): a stock Llama-shaped causal LM
(benchmarks/scale.py's presets, random weights, no download) as a ``generate`` target,
through the CLI in a scratch git project:

    compile        gatekeeper compile: the cold first generation (prefill and decode
                   compiled), the bundle published
    warm --probe   into an empty cache dir, then the first generation of a fresh
                   process: its time, its first token's, FX graph cache hits and misses
    service        docs/generation.md's service on the warmed dir, a fresh interpreter
                   each: its first generate(), then the same again on that dir (hot)
    check          eager vs compiled: TTFT, TPOT (median, p95), decode tokens/s, e2e;
                   on a GPU the decode's bandwidth and its fraction of the device's peak

Usage, from the repo root:

    python benchmarks/generate.py --size tiny|100m|300m|1b|8b [--dtype fp32|bf16]
        [--device cpu|cuda] [--mode default|reduce-overhead]
        [--strategy whole|regional|aot]
        [--prompt 32] [--new-tokens 16] [--min-time 2] [--json out.json] [--keep]

``--strategy aot``: the target's static-cache forward exported into one AOTInductor
package; its service is docs/generation.md's deploy block (the package loaded and
looped over: no FX graph cache, its hits and misses read 0).

``--record PATH --trials N``: instead, N unchanged pull requests of a one-layer tiny
LlamaForCausalLM, each checked paired with main for 30 s of rounds (what a slower pull
request takes: its rounds go on to ``max_time``, 3 x the default ``min_time``); each
trial's per-round time per output token (and time to first token) of base and head go
to PATH
(tests/data/paired_tpot_samples.json was recorded so, for
tests/gate/test_detection_power.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
TARGET = "lm/fixed/default+generate"
CONFIG = """\
store = "store"
precompile = "off"

[measure]
min_time = {min_time}
max_time = {max_time}
shape_sweep = false

[[models]]
name = "lm"
factory = "scale_model:make"
inputs = {{ input_ids = {{ shape = [1, {prompt}], dtype = "int64", high = {vocab} }} }}
tasks = ["generate"]
generate = {{ new_tokens = {new_tokens} }}
modes = ["{mode}"]
device = "{device}"
strategies = ["{strategy}"]
"""
# docs/generation.md's service (its "A service that starts warm" block) for this model:
# the first generate() of a fresh interpreter, timed, and the FX graph cache's counters
SERVICE = """\
import json
import time

import torch
from torch._dynamo.utils import counters

from scale_model import make

model = make().eval()
{compiled}
torch.manual_seed(0)
prompt = torch.randint(0, {vocab}, (1, {prompt}), device={device!r})
with torch.no_grad():
    start = time.perf_counter()
    model.generate(
        prompt,
        max_new_tokens={new_tokens},
        min_new_tokens={new_tokens},  # EOS ignored, as gatekeeper's generation
        do_sample=False,
        cache_implementation="static",
        disable_compile=True,
    )
    if {device!r} == "cuda":
        torch.cuda.synchronize()
    first = time.perf_counter() - start
inductor = counters["inductor"]
print(json.dumps({{"first_generate_s": first, "hits": inductor["fxgraph_cache_hit"],
                  "misses": inductor["fxgraph_cache_miss"]}}))
"""
# an aot target's deploy (docs/generation.md's "An AOTInductor generation" block): its
# model built untimed (a service has it; a package without its weights binds them), the
# package loaded and its first generation, timed together; no FX graph cache
AOT_SERVICE = """\
import json
import time

import torch

import gatekeeper
from scale_model import make

model = make().eval()
torch.manual_seed(0)
prompt = torch.randint(0, {vocab}, (1, {prompt}), device={device!r})
with torch.no_grad():
    start = time.perf_counter()
    step = gatekeeper.load_aot("gatekeeper.toml", "lm/fixed/{mode}+generate+aot", model=model)
    at = torch.arange(prompt.shape[1], device=prompt.device)
    logits = step(input_ids=prompt, cache_position=at)[:, -1]
    tokens = [logits.argmax(dim=-1, keepdim=True)]
    for n in range({new_tokens} - 1):
        position = torch.tensor([prompt.shape[1] + n], device=prompt.device)
        logits = step(input_ids=tokens[-1], cache_position=position)[:, -1]
        tokens.append(logits.argmax(dim=-1, keepdim=True))
    if {device!r} == "cuda":
        torch.cuda.synchronize()
    first = time.perf_counter() - start
print(json.dumps({{"first_generate_s": first, "hits": 0, "misses": 0}}))
"""
# how the service compiles, by the target's strategy (docs/generation.md's blocks)
COMPILED = {
    "whole": "model.forward = torch.compile(model.forward, mode={mode!r})",
    "regional": (
        "torch._dynamo.config.recompile_limit = 8 * len(model.model.layers)\n"
        "for layer in model.model.layers:\n"
        "    layer.compile(mode={mode!r})"
    ),
    "aot": "",  # AOT_SERVICE
}
# the recorded trials' model: tests/e2e/test_generate.py's
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=2048,
)


def _scale():
    spec = importlib.util.spec_from_file_location("scale_bench", ROOT / "benchmarks" / "scale.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def git(repo: Path, *args: str) -> None:
    cmd = ["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@localhost", *args]
    subprocess.run(cmd, check=True, capture_output=True)


def gk(repo: Path, *args: str) -> tuple[dict, float, str]:
    """``gatekeeper <args> --json``: its document, wall seconds, stderr's last line."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "gatekeeper", *args, "--json"],
        cwd=repo,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    if proc.returncode not in (0, 1):
        sys.exit(f"gatekeeper {' '.join(args)} exited {proc.returncode}: {lines[-3:]}")
    return (json.loads(proc.stdout) if proc.stdout.strip() else {}), wall, lines[-1:]


def project(repo: Path, size: dict, args: argparse.Namespace) -> None:
    """A git repository (main): the factory and the generate target's config."""
    repo.mkdir(parents=True, exist_ok=True)
    dtype = {"fp32": "float32", "bf16": "bfloat16"}[args.dtype]
    (repo / "scale_model.py").write_text(_scale().factory(size, dtype, args.device))
    (repo / "gatekeeper.toml").write_text(
        CONFIG.format(
            min_time=args.min_time,
            max_time=args.max_time or 3 * args.min_time,
            prompt=args.prompt,
            vocab=size["vocab_size"],
            new_tokens=args.new_tokens,
            mode=args.mode,
            device=args.device,
            strategy=args.strategy,
        )
    )
    (repo / "service.py").write_text(
        (AOT_SERVICE if args.strategy == "aot" else SERVICE).format(
            compiled=COMPILED[args.strategy].format(mode=args.mode),
            mode=args.mode,
            vocab=size["vocab_size"],
            prompt=args.prompt,
            device=args.device,
            new_tokens=args.new_tokens,
        )
    )
    (repo / ".gitignore").write_text("store/\nout/\nwarm/\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "main")


def _result(repo: Path, out: str) -> dict:
    return json.loads((repo / out / "results.json").read_text())["targets"][0]


def bench(repo: Path, strategy: str) -> dict:
    """compile, warm --probe, check (an aot target's check first: warm serves a verified
    package only): the figures of docs/generation.md's table."""
    compiled, compile_wall, _ = gk(repo, "compile")
    (c,) = compiled["targets"]
    if strategy == "aot":
        _, check_wall, _ = gk(repo, "check", "--out", "out/check")
    warmed, _, _ = gk(repo, "warm", "--probe", "--cache-dir", str(repo / "warm"))
    (w,) = warmed["targets"]
    warmed_service, hot_service = service(repo), service(repo)
    if strategy != "aot":
        _, check_wall, _ = gk(repo, "check", "--out", "out/check")
    r = _result(repo, "out/check")
    if r["status"] != "ok":
        sys.exit(f"check failed: {r.get('error')}")
    gen = r["generation"]
    return {
        "cold_first_generate_s": c.get("compile_seconds"),
        "compile_wall_s": compile_wall,
        "warm_first_generate_s": w.get("first_call_seconds"),
        "warm_first_token_s": w.get("first_token_seconds"),
        "warm_fx": f"{w.get('fxgraph_cache_hit')} hits, {w.get('fxgraph_cache_miss')} misses",
        "service_first_generate_s": warmed_service["first_generate_s"],
        "service_fx": f"{warmed_service['hits']} hits, {warmed_service['misses']} misses",
        "hot_service_first_generate_s": hot_service["first_generate_s"],
        "hot_service_fx": f"{hot_service['hits']} hits, {hot_service['misses']} misses",
        "check_wall_s": check_wall,
        "parity": (r["parity"]["vs_eager"] or {}).get("detail"),
        "eager": gen["eager"],
        "compiled": gen["compiled"],
        "bandwidth_gbs": gen.get("bandwidth_gbs"),
        "peak_fraction": gen.get("peak_fraction"),
        "weight_bytes": r["memory"].get("weight_bytes"),
        "rounds": len(gen["samples"]["per_token"]),
        "graphs": r["graphs"]["count"],
    }


def service(repo: Path) -> dict:
    """service.py in a fresh interpreter on the warmed cache dir: its first generate()."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(repo / "warm")}
    proc = subprocess.run(
        [sys.executable, "service.py"], cwd=repo, env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        sys.exit(f"service.py exited {proc.returncode}: {proc.stderr.strip().splitlines()[-3:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(found: dict) -> str:
    rows = []
    for side in ("eager", "compiled"):
        s = found[side]
        rows.append(
            [
                side,
                f"{s['ttft_s'] * 1e3:.1f}",
                f"{s['tpot_s'] * 1e3:.1f}",
                f"{s['tpot_p95_s'] * 1e3:.1f}",
                f"{s['tokens_per_s']:.1f}",
                f"{s['e2e_s']:.2f}",
            ]
        )
    head = ["", "TTFT ms", "TPOT ms", "TPOT p95 ms", "tokens/s", "e2e s"]
    return tabulate(rows, head)


def record(args: argparse.Namespace, repo: Path) -> None:
    """``--record``: unchanged pull requests, paired with main, their per-round samples."""
    project(repo, TINY, args)
    gk(repo, "compile")
    git(repo, "checkout", "-q", "-b", "pr")
    (repo / "NOTES.md").write_text("A pull request that changes no model.\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "pr")
    trials = []
    for n in range(args.trials):
        start = time.perf_counter()
        gk(repo, "check", "--base-ref", "main", "--out", f"out/trial{n}")
        r = _result(repo, f"out/trial{n}")
        head, base = r["generation"]["samples"], r["paired"]["generation"]["samples"]
        trials.append(
            {
                "base": base["per_token"],
                "head": head["per_token"],
                "base_first_token": base["first_token"],
                "head_first_token": head["first_token"],
                "disturbed": r["latency"]["disturbance"],
            }
        )
        print(
            f"trial {n + 1}/{args.trials}: {len(head['per_token'])} rounds "
            f"({time.perf_counter() - start:.0f} s)",
            file=sys.stderr,
        )
        Path(args.record).write_text(json.dumps({"note": _note(args), "trials": trials}))


def _note(args: argparse.Namespace) -> dict:
    import torch

    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "what": "paired samples of unchanged code, a generate target: per round, the base "
        "commit's and the head's time per output token (the median gap between a "
        "generation's later tokens; generation.samples.per_token and "
        "paired.generation.samples.per_token), and their time to first token",
        "command": " ".join(
            [
                *(f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS",) if k in os.environ),
                *(["nice", "-n", str(os.nice(0))] if os.nice(0) else []),
                "python",
                "benchmarks/generate.py",
                *sys.argv[1:],
            ]
        ),
        "machine": f"{os.cpu_count()}-core {platform.machine()} CPU, torch {torch.__version__}",
        "commit": commit,
        "recorded": time.strftime("%Y-%m-%d"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1b", choices=sorted(_scale().SIZES))
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--mode", default="default")
    ap.add_argument(
        "--strategy", default="whole", choices=sorted(COMPILED), help="the target's strategies"
    )
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--min-time", type=float, default=2.0)
    ap.add_argument("--max-time", type=float, help="default: 3 x --min-time")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--keep", action="store_true", help="keep the scratch project")
    ap.add_argument("--record", metavar="PATH", help="record unchanged paired trials here")
    ap.add_argument("--trials", type=int, default=12)
    args = ap.parse_args()
    repo = Path(tempfile.mkdtemp(prefix="gk-generate-")) / "project"
    if args.record:
        # as many rounds as a slower pull request takes (it does not stop at min_time):
        # the paired rounds' limit, with no early stop
        args.min_time = args.min_time if "--min-time" in sys.argv else 30.0
        args.max_time = args.min_time
        record(args, repo)
        print(f"{args.trials} trials -> {args.record} ({repo})")
        return 0
    project(repo, _scale().SIZES[args.size], args)
    found = bench(repo, args.strategy)
    print(table(found))
    print(
        f"\ncold first generate {found['cold_first_generate_s']:.1f} s, warm "
        f"{found['warm_first_generate_s']:.2f} s (first token "
        f"{found['warm_first_token_s']:.2f} s; {found['warm_fx']}); "
        f"{found['rounds']} timed rounds; {found['graphs']} graphs; parity: {found['parity']}"
    )
    warmed, hot = found["service_first_generate_s"], found["hot_service_first_generate_s"]
    print(
        f"service on the warmed dir: first generate {warmed:.2f} s ({found['service_fx']}); "
        f"the same again, hot: {hot:.2f} s ({found['hot_service_fx']}); {warmed / hot:.2f}x"
    )
    if found["bandwidth_gbs"] is not None:
        frac = found["peak_fraction"]
        print(
            f"decode bandwidth {found['bandwidth_gbs']:.0f} GB/s"
            + (f", {frac:.0%} of peak" if frac else "")
        )
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=2))
    print(f"{repo}; {sys.executable}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
