"""A stock Llama-shaped causal LM through every stage, as a user runs it: each stage's wall
time and peak memory as a multiple of the model's weight bytes, and the bundle sizes.

The model is transformers' ``LlamaForCausalLM`` built from a ``LlamaConfig`` with random
weights (no download), at a ``--size`` preset (``1b`` is the Llama-3.2-1B / TinyLlama
shape: hidden 2048, 16 layers, 32k vocabulary) and a ``--dtype``. A scratch git project
holds a factory module and a ``gatekeeper.toml`` configured as docs/models.md tells a
user (keyword inputs ``input_ids``, ``attention_mask``), with targets ``lm/b1-s128/default``
and ``lm/b1-s128/default+aot`` (``export.weights = "bound"``: the package without its
weights). Each stage runs the CLI in a subprocess, through a small wrapper process that
times it and reads ``getrusage(RUSAGE_CHILDREN).ru_maxrss``: the peak resident set of the
largest process in that stage's tree (the CLI or its worker), so each figure is that
stage's own.

    build             python + torch + transformers + the model, nothing else (the floor)
    compile           gatekeeper compile (the whole target): the bundle into the store
    warm --probe      into an empty cache dir, then the first compiled call
    check             one check of main (published as main's baseline by baseline --ref)
    run, paired       a branch that changes a comment of the factory: gatekeeper run
                      --base-ref main, as the Action runs it (base and head in one worker)
    aot compile       gatekeeper compile of the +aot target: export, AOTInductor package
    aot check         its check, the package run on the model's weights bound at load
    aot warm          the package into a fresh cache dir (download, verify, extract)
    load_aot + call   a fresh process: the model built, gatekeeper.load_aot(model=...),
                      one call

Usage, from the repo root (the 1B model in fp32 needs ~20 GB free for the paired stage):

    python benchmarks/scale.py [--arch llama|qwen2|qwen3|gemma3|gpt2|gpt_neox|mistral|mixtral|...]
        --size tiny|100m|300m|1b|8b|... [--dtype fp32|bf16] [--device cpu|cuda]
        [--load config|checkpoint] [--stages compile,warm,...] [--min-time 1]
        [--json out.json] [--keep]

``--load checkpoint``: the model is saved once beside the project (``save_pretrained``)
and the factory loads it (``from_pretrained``), as a service loads its weights; the
safetensors file is mapped, so its pages are the page cache's until read.

``8b`` is the Llama-3-8B shape (hidden 4096, 32 layers, 128k vocabulary): in bf16 on a
GPU (16 GB of weights), the check issue 43 asks for on one 80 GB card. The last column
is the worker's own peak as results.json reports it: the CUDA allocator's on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

# the tiny presets' common shape (a tiny preset adds its own fields)
TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4)
# Each architecture: its transformers config and model classes, whether its input and
# output embeddings are one tensor, and its size presets (config fields; parameters in
# the comment). Every preset is built from its config with random weights.
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", False, {
        "tiny": dict(hidden_size=256, num_hidden_layers=4, intermediate_size=688,
                     num_attention_heads=4, num_key_value_heads=2, vocab_size=8192),  # 7.4M
        "100m": dict(hidden_size=768, num_hidden_layers=8, intermediate_size=2048,
                     num_attention_heads=12, num_key_value_heads=4, vocab_size=32000),  # 0.1B
        "300m": dict(hidden_size=1024, num_hidden_layers=16, intermediate_size=2816,
                     num_attention_heads=16, num_key_value_heads=4, vocab_size=32000),  # 0.27B
        "1b": dict(hidden_size=2048, num_hidden_layers=16, intermediate_size=8192,
                   num_attention_heads=32, num_key_value_heads=8, vocab_size=32000),  # 1.1B
        "8b": dict(hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
                   num_attention_heads=32, num_key_value_heads=8, vocab_size=128256),  # 8.0B
    }),
    # Qwen2: tied embeddings, a 151,936-word vocabulary (the embedding is 28% of 0.5B)
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", True, {
        "tiny": dict(TINY, num_key_value_heads=2, vocab_size=151936),  # 9.8M
        "0.5b": dict(hidden_size=896, num_hidden_layers=24, intermediate_size=4864,
                     num_attention_heads=14, num_key_value_heads=2, vocab_size=151936),  # 494M
    }),
    # Qwen3: as Qwen2, and each head's queries and keys RMS-normed (q_norm, k_norm),
    # head_dim 128 apart from hidden / heads, no QKV biases
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", True, {
        "tiny": dict(TINY, num_key_value_heads=2, head_dim=32,
                     vocab_size=151936),  # 9.8M
        "0.6b": dict(hidden_size=1024, num_hidden_layers=28, intermediate_size=3072,
                     num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                     vocab_size=151936),  # 596M (Qwen3-0.6B shape)
    }),
    # Gemma 3: tied, a 262,144-word vocabulary (63% of the 270M model), head_dim 256,
    # local sliding-window layers (512 tokens) between global ones, scaled embeddings
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", True, {
        "tiny": dict(TINY, num_key_value_heads=1, head_dim=16,
                     vocab_size=262144, sliding_window=512),  # 16.8M
        "270m": dict(hidden_size=640, num_hidden_layers=18, intermediate_size=2048,
                     num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                     vocab_size=262144, sliding_window=512),  # 268M
    }),
    # GPT-2: tied, learned positions, Conv1D weights stored transposed ([in, out]),
    # fused QKV, a 50,257-word vocabulary (31% of the 124M model)
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", True, {
        "tiny": dict(n_embd=64, n_layer=2, n_head=4, vocab_size=50257),  # 3.3M
        "124m": dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257),  # 124M
    }),
    # GPT-NeoX (Pythia): untied, rotary on a quarter of each head, attention and MLP in
    # parallel from one residual, fused QKV, biases everywhere
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", False, {
        "tiny": dict(hidden_size=64, num_hidden_layers=2, intermediate_size=256,
                     num_attention_heads=4, vocab_size=50304),  # 6.6M
        "410m": dict(hidden_size=1024, num_hidden_layers=24, intermediate_size=4096,
                     num_attention_heads=16, vocab_size=50304),  # 405M (Pythia-410M shape)
    }),
    # Mistral: untied, every layer's attention a sliding window (4,096 tokens in the 7B)
    "mistral": ("MistralConfig", "MistralForCausalLM", False, {
        "tiny": dict(TINY, num_key_value_heads=2, vocab_size=32768,
                     sliding_window=64),  # 4.3M
    }),
    # Mixtral: a sparse mixture of experts (each token routed to 2 of 8 MLPs), untied;
    # transformers runs its experts by grouped_mm, which has no float64 kernel
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", False, {
        "tiny": dict(TINY, num_key_value_heads=2, vocab_size=32000,
                     num_local_experts=8, num_experts_per_tok=2),  # 4.5M
        "180m": dict(hidden_size=512, num_hidden_layers=8, intermediate_size=1408,
                     num_attention_heads=8, num_key_value_heads=2, vocab_size=32000,
                     num_local_experts=8, num_experts_per_tok=2),  # 176M
    }),
    # tiny presets of more stock architectures, each with a feature the others lack
    # (docs/scale.md, "More architectures, tiny"): Phi-3's partial rotary and fused
    # projections; Gemma 2's logit soft-capping (tied, a 256k vocabulary); Qwen2-MoE's
    # shared expert beside its routed ones; OLMo 2's norms after each block (untied);
    # Falcon's parallel attention and MLP with grouped KV heads (tied)
    "phi3": ("Phi3Config", "Phi3ForCausalLM", False, {
        "tiny": dict(TINY, num_key_value_heads=4, vocab_size=32064,
                     partial_rotary_factor=0.5, pad_token_id=0),
    }),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", True, {
        "tiny": dict(TINY, num_key_value_heads=2, head_dim=16,
                     vocab_size=256000, sliding_window=64),
    }),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", False, {
        "tiny": dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                     moe_intermediate_size=64, shared_expert_intermediate_size=128,
                     num_attention_heads=4, num_key_value_heads=2, vocab_size=151936,
                     num_experts=4, num_experts_per_tok=2),
    }),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", False, {
        "tiny": dict(TINY, num_key_value_heads=4, vocab_size=50304,
                     pad_token_id=1),
    }),
    "falcon": ("FalconConfig", "FalconForCausalLM", True, {
        "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     vocab_size=65024, new_decoder_architecture=True, num_kv_heads=2),
    }),
}  # fmt: skip
SIZES = ARCHS["llama"][3]
STAGES = (
    "build", "floor", "compile", "warm", "check", "paired", "aot", "aot-paired", "aot-warm", "load"
)  # fmt: skip
# "aot" is the +aot target's compile and check (warm installs only a verified package);
# "aot-paired" its paired run of the unchanged pull request
TARGET = "lm/b1-s128/default"
AOT = TARGET + "+aot"

FACTORY = """\
import torch
from transformers import {config_cls}, {model_cls}

SIZE = {size!r}
DTYPE = {dtype!r}
DEVICE = {device!r}


def make():
    # built in its dtype on its device: an 8B model's random init in float32 on the CPU
    # would take minutes and 32 GB before the cast
    torch.manual_seed(0)
    config = {config_cls}(**SIZE, max_position_embeddings=2048, tie_word_embeddings={tied})
    default = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, DTYPE))
    try:
        with torch.device(DEVICE):
            model = {model_cls}(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval()
"""


# --load checkpoint: the factory a service has, loading the weights a checkpoint holds
# (saved once by the config factory above, outside the project, as safetensors)
LOADER = """\
import torch
from transformers import {model_cls}

CHECKPOINT = {checkpoint!r}
DTYPE = {dtype!r}
DEVICE = {device!r}


def make():
    model = {model_cls}.from_pretrained(CHECKPOINT, dtype=getattr(torch, DTYPE))
    return model.to(DEVICE).eval()
"""


def factory(size: dict, dtype: str, device: str, arch: str = "llama") -> str:
    """The source of ``scale_model.py``: ``make()`` builds ``arch``'s model of the config
    fields ``size`` (a preset of :data:`ARCHS`, or any) in ``dtype`` on ``device``, with
    random weights (benchmarks/generate.py writes the same)."""
    config_cls, model_cls, tied, _ = ARCHS[arch]
    return FACTORY.format(
        size=size,
        dtype=dtype,
        device=device,
        config_cls=config_cls,
        model_cls=model_cls,
        tied=tied,
    )


CONFIG = """\
[tool.gatekeeper]
store = "store"

[tool.gatekeeper.measure]
min_time = {min_time}
timeout = 7200  # a real-size worker on a shared 2-core machine outlasts the default 1800 s

[[tool.gatekeeper.models]]
name = "lm"
factory = "scale_model:make"
shapes = [{{ batch = 1, seq = 128 }}]
strategies = ["whole", "aot"]
export = {{ weights = "bound" }}
device = "{device}"

[tool.gatekeeper.models.inputs]
input_ids = {{ shape = ["batch", "seq"], dtype = "int64", high = {vocab} }}
attention_mask = {{ shape = ["batch", "seq"], dtype = "int64", low = 1, high = 2 }}
"""

# One stage: the command in a child, its wall time and the largest peak RSS in its tree.
WRAPPER = """\
import json, resource, subprocess, sys, time
start = time.perf_counter()
proc = subprocess.run(sys.argv[2:], capture_output=True, text=True, stdin=subprocess.DEVNULL)
wall = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
with open(sys.argv[1], "w") as f:
    json.dump({"rc": proc.returncode, "wall_s": wall, "peak_rss": peak,
               "stdout": proc.stdout, "stderr": proc.stderr[-4000:]}, f)
"""

BUILD = """\
import sys, torch, scale_model
m = scale_model.make()
n = sum(t.numel() * t.element_size() for t in [*m.parameters(), *m.buffers()])
print(n, sum(p.numel() for p in m.parameters()))
"""

# the least a compile-and-call peaks at: the build, torch.compile and one call, nothing else
FLOOR = """\
import torch, scale_model
m = scale_model.make()
g = torch.Generator().manual_seed(0)
ids = torch.randint(0, m.config.vocab_size, (1, 128), generator=g).to(m.device)
with torch.no_grad():
    torch.compile(m)(input_ids=ids, attention_mask=torch.ones_like(ids))
"""

LOAD = """\
import sys, time, torch, gatekeeper, scale_model
model = scale_model.make()
t0 = time.perf_counter()
fn = gatekeeper.load_aot("gatekeeper.toml", sys.argv[1], cache_dir=sys.argv[2], model=model)
t1 = time.perf_counter()
g = torch.Generator().manual_seed(0)
ids = torch.randint(0, model.config.vocab_size, (1, 128), generator=g).to(model.device)
with torch.no_grad():
    out = fn(input_ids=ids, attention_mask=torch.ones_like(ids))
t2 = time.perf_counter()
logits = out["logits"] if isinstance(out, dict) or hasattr(out, "keys") else out[0]
print(f"{t1 - t0:.2f} {t2 - t1:.2f} {tuple(logits.shape)}")
"""


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=scale", "-c", "user.email=scale@localhost", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


def scratch(
    work: Path,
    size: str,
    dtype: str,
    min_time: float,
    device: str = "cpu",
    arch: str = "llama",
    load: str = "config",
) -> Path:
    """The scratch project. ``load="checkpoint"``: the config factory's model is saved
    once (``save_pretrained``, beside the project) and the factory loads it, as a service
    loads its weights; ``"config"``: the factory builds the model from its config."""
    repo = work / "repo"
    repo.mkdir()
    preset = ARCHS[arch][3][size]
    (repo / "scale_model.py").write_text(factory(preset, dtype, device, arch))
    if load == "checkpoint":
        checkpoint = work / "checkpoint"
        save = f"import scale_model; scale_model.make().save_pretrained({str(checkpoint)!r})"
        subprocess.run([sys.executable, "-c", save], cwd=repo, check=True,
                       env={**os.environ, "PYTHONPATH": str(repo)})  # fmt: skip
        loader = LOADER.format(
            model_cls=ARCHS[arch][1], checkpoint=str(checkpoint), dtype=dtype, device=device
        )
        (repo / "scale_model.py").write_text(loader)
    vocab = preset["vocab_size"]
    (repo / "gatekeeper.toml").write_text(
        CONFIG.format(min_time=min_time, vocab=vocab, device=device)
    )
    (repo / ".gitignore").write_text(".gatekeeper/\nstore/\nout*/\ncache*/\nresults.json\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "the model")
    return repo


class StageFailed(Exception):
    """A stage exited with a code it should not have: the stages before it still print."""


def stage(repo: Path, *cmd: str, ok=(0, 1)) -> dict:
    """Run ``cmd`` through the wrapper: its wall time, peak RSS and output."""
    out = repo.parent / "stage.json"
    # the workflow's ceiling on measure.timeout (the box's, 3600 s unset) raised to the
    # config's: a real-size paired worker outlasts an hour on a shared 2-core machine
    env = {"GATEKEEPER_MAX_TIMEOUT": "7200", **os.environ, "PYTHONPATH": str(repo)}
    subprocess.run([sys.executable, "-c", WRAPPER, str(out), *cmd], cwd=repo, env=env, check=True)
    r = json.loads(out.read_text())
    if r["rc"] not in ok:
        raise StageFailed(f"{' '.join(cmd)} exited {r['rc']}:\n{r['stderr']}")
    return r


def gk(repo: Path, *args: str) -> dict:
    return stage(repo, sys.executable, "-m", "gatekeeper", *args)


def peaks(doc: object, path: str = "") -> dict[str, object]:
    """Every field of a results document whose name says peak (a ``peak_x_weights`` or a
    memory figure), wherever it is: read defensively, the schema may grow."""
    found: dict[str, object] = {}
    if isinstance(doc, dict):
        for k, v in doc.items():
            p = f"{path}.{k}" if path else str(k)
            if "peak" in str(k) and not isinstance(v, (dict, list)):
                found[p] = v
            else:
                found.update(peaks(v, p))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            found.update(peaks(v, f"{path}[{i}]"))
    return found


def results_figures(path: Path) -> dict:
    if not path.is_file():
        return {}
    doc = json.loads(path.read_text())
    figures: dict = {"peaks": peaks(doc)}
    for t in doc.get("targets", []):
        aot = t.get("aot") or {}
        if aot:
            figures["aot"] = {k: aot.get(k) for k in ("weights", "bytes", "weight_bytes")}
    return figures


def files(root: Path, pattern: str = "*") -> dict[str, int]:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob(pattern) if p.is_file()}


def gb(n: float | None) -> str:
    if n is None:
        return ""
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def run_stages(repo: Path, wanted: set[str]) -> tuple[dict, list[dict]]:
    built = stage(repo, sys.executable, "-c", BUILD, ok=(0,))
    weight_bytes, params = map(int, built["stdout"].split())
    info = {"weight_bytes": weight_bytes, "params": params}
    rows = [dict(built, stage="build (python + torch + the model)")] if "build" in wanted else []

    def add(name: str, r: dict, results: Path | None = None) -> None:
        row = dict(r, stage=name)
        if results is not None:
            row["results"] = results_figures(results)
        rows.append(row)
        print(f"{name}: {r['wall_s']:.1f} s, {gb(r['peak_rss'])}", file=sys.stderr, flush=True)

    try:
        _stages(repo, wanted, info, add)
    except StageFailed as e:
        info["failed"] = str(e)
    return info, rows


def paired(repo: Path, target: str, out: str, name: str, add) -> None:
    """``gatekeeper run --base-ref main`` of ``target`` on a ``pr`` branch whose factory
    gains a comment (made once): the Action's paired check of an unchanged PR."""
    if subprocess.run(["git", "rev-parse", "--verify", "-q", "pr"], cwd=repo,
                      capture_output=True).returncode:  # fmt: skip
        git(repo, "checkout", "-qb", "pr")
        factory = repo / "scale_model.py"
        factory.write_text(factory.read_text() + "# a comment: the PR changes nothing\n")
        git(repo, "commit", "-qam", "a comment")
    else:
        git(repo, "checkout", "-q", "pr")
    args = ("run", "--base-ref", "main", "--target", target, "--out", out)
    r = stage(repo, sys.executable, "-m", "gatekeeper", *args, ok=(0, 1, 2))
    add(f"{name} (exit {r['rc']})", r, repo / out / "results.json")
    print(r["stdout"][-2000:], file=sys.stderr, flush=True)  # the verdict and its reasons
    git(repo, "checkout", "-q", "main")
    if r["rc"] not in (0, 1):  # after the row: a worker's death is a figure too
        raise StageFailed(f"{target} paired exited {r['rc']}:\n{r['stderr']}")


def _stages(repo: Path, wanted: set[str], info: dict, add) -> None:
    if "floor" in wanted:
        add("floor: the build, torch.compile and one call", stage(repo, sys.executable, "-c",
                                                                  FLOOR, ok=(0,)))  # fmt: skip
    if "compile" in wanted:
        add("compile", gk(repo, "compile", "--target", TARGET))
        info["store_after_compile"] = files(repo / "store")
    if "warm" in wanted:
        add("warm --probe, fresh cache", gk(repo, "warm", "--probe", "--target", TARGET,
                                            "--cache-dir", "cache-warm"))  # fmt: skip
    if "check" in wanted:
        add("check", gk(repo, "check", "--target", TARGET, "--out", "out-check"),
            repo / "out-check/results.json")  # fmt: skip
        gk(repo, "baseline", "--ref", "main", "--results", "out-check/results.json")
    if "paired" in wanted:
        paired(repo, TARGET, "out-pr", "run, paired, unchanged PR", add)
    if "aot" in wanted:
        before = set(files(repo / "store"))
        r = gk(repo, "compile", "--target", AOT)
        add("aot compile (weights bound)", r)
        info["aot_bundle"] = {k: v for k, v in files(repo / "store").items() if k not in before}
        # warm installs only packages a check verified: the check binds the weights too
        r = gk(repo, "check", "--target", AOT, "--out", "out-aot")
        add("aot check (weights bound)", r, repo / "out-aot/results.json")
    if "aot-paired" in wanted:
        paired(repo, AOT, "out-aot-pr", "aot run, paired, unchanged PR", add)
    if "aot-warm" in wanted or "load" in wanted:
        add("aot warm (fresh cache)", gk(repo, "warm", "--target", AOT, "--cache-dir", "cache-aot"))
        info["pt2"] = files(repo / "cache-aot", "*.pt2")
    if "load" in wanted:
        r = stage(repo, sys.executable, "-c", LOAD, AOT, "cache-aot", ok=(0,))
        load_s, call_s, _ = r["stdout"].split(maxsplit=2)
        add(f"load_aot {load_s} s + first call {call_s} s (fresh process)", r)


def table(info: dict, rows: list[dict]) -> str:
    w = info["weight_bytes"]

    def reported(r: dict) -> str:  # the worker's own peak (the CUDA allocator's on a GPU)
        found = [v for k, v in (r.get("results") or {}).get("peaks", {}).items()
                 if k.endswith("peak_x_weights") and isinstance(v, (int, float))]  # fmt: skip
        return f"{max(found):.2f}" if found else ""

    body = [[r["stage"], f"{r['wall_s']:.1f} s", gb(r["peak_rss"]), f"{r['peak_rss'] / w:.2f}",
             reported(r)] for r in rows]  # fmt: skip
    heads = ["stage", "wall", "peak RSS", "x weights", "worker's peak x weights"]
    return tabulate(body, headers=heads, tablefmt="github")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=tuple(ARCHS), default="llama")
    sizes = sorted({s for arch in ARCHS.values() for s in arch[3]})
    ap.add_argument("--size", choices=sizes, default="tiny", help="a preset of --arch")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--device", default="cpu", help="the model's device: cpu or cuda")
    ap.add_argument(
        "--stages", default=",".join(STAGES), help="comma-separated: " + ",".join(STAGES)
    )
    ap.add_argument(
        "--load",
        choices=("config", "checkpoint"),
        default="config",
        help="the factory builds the model from its config (random weights), or loads a "
        "checkpoint of it saved once beside the project (from_pretrained)",
    )
    ap.add_argument("--min-time", type=float, default=1.0, help="measure.min_time (s)")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    ap.add_argument("--keep", action="store_true", help="keep the scratch project")
    a = ap.parse_args()
    if a.size not in ARCHS[a.arch][3]:
        ap.error(f"--arch {a.arch} has sizes {', '.join(ARCHS[a.arch][3])}")
    wanted = set(a.stages.split(","))
    dtype = {"fp32": "float32", "bf16": "bfloat16"}[a.dtype]
    work = Path(tempfile.mkdtemp(prefix="gk-scale-"))
    repo = scratch(work, a.size, dtype, a.min_time, a.device, a.arch, a.load)
    try:
        info, rows = run_stages(repo, wanted)
    finally:
        if not a.keep:
            subprocess.run(["rm", "-rf", str(work)], check=False)
        else:
            print(f"scratch project: {repo}", file=sys.stderr)
    w = info["weight_bytes"]
    print(f"{ARCHS[a.arch][1]} {a.size}: {info['params'] / 1e6:.1f}M parameters, {a.dtype}, "
          f"{a.device}, weights {gb(w)}, the factory from its {a.load}\n")  # fmt: skip
    print(table(info, rows))
    for label, key in (("store after compile", "store_after_compile"),
                       ("aot bundle", "aot_bundle"), (".pt2", "pt2")):  # fmt: skip
        found = info.get(key) or {}
        if found:
            big = sorted(found.items(), key=lambda kv: -kv[1])[:4]
            listed = ", ".join(f"{k} {gb(v)}" for k, v in big)
            print(f"\n{label}: {gb(sum(found.values()))} in {len(found)} files ({listed})")
    for r in rows:
        for k, v in (r.get("results") or {}).get("peaks", {}).items():
            print(f"{r['stage']}: results.json {k} = {v}")
    if a.json:
        for r in rows:
            r.pop("stdout", None), r.pop("stderr", None)
        doc = {"arch": a.arch, "size": a.size, "dtype": a.dtype, "load": a.load, **info,
               "rows": rows}  # fmt: skip
        a.json.write_text(json.dumps(doc, indent=2))
    if "failed" in info:
        sys.exit(f"stopped: {info['failed']}")


if __name__ == "__main__":
    main()
