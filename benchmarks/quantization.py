"""Quantized variants beside their float model (docs/quantization.md): the example
transformer block and a stock transformers model (a 2-layer BERT, random weights), each
as float, int8 weight-only and int8 dynamic (torchao), through the real CLI in a
scratch project: SQNR vs the float model, p50 and weight bytes as ratios of the float
target's, the cold compile and the first call after a warm start.

    python benchmarks/quantization.py [--min-time 3] [--json PATH] [--device cpu|cuda]
        [--configs none,int8-weight-only,int8-dynamic,float8-dynamic]

On a GPU (``--device cuda``) add ``float8-dynamic`` (compute capability 8.9 or newer).

Needs torchao (``pip install 'gatekeeper[quant]'``) and transformers. Prints a markdown
table (the one in docs/quantization.md) and, with ``--json``, the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from gatekeeper.quantize import SUFFIX

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ["none", "int8-weight-only", "int8-dynamic"]
CONFIG = """
store = "store"
precompile = "off"

[measure]
min_time = {min_time}
shape_sweep = false

[[models]]
name = "block"
factory = "tiny_models:transformer_block"
inputs = [{{ shape = ["batch", "seq"], dtype = "int64", low = 0, high = 512 }}]
shapes = [{{ batch = 4, seq = 64 }}]
quantize = {configs}
device = "{device}"

[[models]]
name = "bert"
factory = "hf_models:bert_tiny"
inputs = [{{ shape = ["batch", "seq"], dtype = "int64", low = 0, high = 1000 }}]
shapes = [{{ batch = 4, seq = 64 }}]
quantize = {configs}
device = "{device}"
"""


def gk(*args: str, cwd: Path, ok: tuple[int, ...] = (0, 1)) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "gatekeeper", *args, "--json"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
    )
    if proc.returncode not in ok:
        sys.exit(f"gatekeeper {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def measure(min_time: float, configs: list[str] = CONFIGS, device: str = "cpu") -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="gk-quant-") as tmp:
        root = Path(tmp)
        for name in ("tiny_models.py", "hf_models.py"):
            shutil.copy(ROOT / "examples" / name, root / name)
        (root / "gatekeeper.toml").write_text(
            textwrap.dedent(
                CONFIG.format(min_time=min_time, configs=json.dumps(configs), device=device)
            )
        )
        # a target that fails to compile (exit 2) is a row of its own, the rest go on
        compiled = {t["target"]: t for t in gk("compile", cwd=root, ok=(0, 1, 2))["targets"]}
        failed = [t for t in compiled.values() if t["status"] == "error"]
        built = [t["target"] for t in compiled.values() if t["status"] != "error"]
        only = [a for target in built for a in ("--target", target)]
        warm = gk("warm", "--cache-dir", str(root / "deploy"), "--probe", *only, cwd=root)
        warmed = {t["target"]: t for t in warm["targets"]}
        gk("check", "--mode", "stored", *only, cwd=root)
        results = json.loads((root / "results.json").read_text())["targets"]
    by_id = {r["target"]: r for r in results}
    rows = [failure(t) for t in failed]
    for r in results:
        q = r.get("quantization")
        twin = by_id[r["target"].split("+")[0]]
        float_bytes = next(
            (
                x["quantization"]["float_weight_bytes"]
                for x in results
                if x["target"].startswith(twin["target"] + "+") and x.get("quantization")
            ),
            None,
        )
        p50, twin_p50 = r["latency"]["compiled"]["p50"], twin["latency"]["compiled"]["p50"]
        rows.append(
            {
                "target": r["target"],
                "config": q["config"] if q else "none",
                "sqnr_db": q["sqnr_db"] if q else None,
                "p50_s": p50,
                "p50_ratio": p50 / twin_p50,
                "weight_bytes": q["weight_bytes"] if q else float_bytes,
                "weight_ratio": q["weight_bytes"] / q["float_weight_bytes"] if q else 1.0,
                "float_weight_bytes": float_bytes,
                "cold_compile_s": compiled[r["target"]].get("compile_seconds"),
                "warm_first_call_s": warmed[r["target"]].get("first_call_seconds"),
                "warm": warmed[r["target"]].get("status"),
            }
        )
    return rows


def failure(compiled: dict) -> dict:
    """The row of a target that did not compile: its error, no figures."""
    base = compiled["target"].split("+")[0]
    config = next((c for c, suffix in SUFFIX.items() if compiled["target"].endswith("+" + suffix)),
                  "none")  # fmt: skip
    return {
        "target": compiled["target"],
        "config": config,
        "twin": base,
        "error": compiled.get("error"),
        "cold_compile_s": compiled.get("compile_seconds"),
    }


def table(rows: list[dict]) -> str:
    def f(x: float | None, fmt: str) -> str:
        return "–" if x is None else format(x, fmt)

    out = [
        "| target | config | SQNR vs float | p50 | p50 vs float | weights | weights vs float "
        "| cold compile | warm first call |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.get("error"):
            out.append(f"| `{r['target']}` | {r['config']} | compile error: {r['error'][:120]} |"
                       + " |" * 6)  # fmt: skip
            continue
        kib = r["weight_bytes"] / 1024 if r["weight_bytes"] is not None else None
        out.append(
            f"| `{r['target']}` | {r['config']} | {f(r['sqnr_db'], '.1f')} dB "
            f"| {r['p50_s'] * 1e3:.3f} ms | {r['p50_ratio']:.2f}x | {f(kib, '.0f')} KiB "
            f"| {r['weight_ratio']:.2f}x | {f(r['cold_compile_s'], '.1f')} s "
            f"| {f(r['warm_first_call_s'], '.2f')} s ({r['warm']}) |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-time", type=float, default=3.0, help="timed seconds per target")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--device", default="cpu", help="the models' device: cpu or cuda")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="quantize values, comma-separated")
    args = ap.parse_args()
    import torch
    import torchao

    rows = measure(args.min_time, args.configs.split(","), args.device)
    gpu = f", {torch.cuda.get_device_name()}" if args.device.startswith("cuda") else ""
    print(
        f"torch {torch.__version__}, torchao {torchao.__version__}{gpu}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, {os.environ.get('OMP_NUM_THREADS', '1')} thread(s)\n"
    )
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
