"""What the float64 parity reference costs in memory on a stock causal LM: the peak
resident set after building the model, and after ``fp64_reference`` on one batch, as
multiples of the weight bytes; once with large linear and embedding layers computed a
part at a time (``fp64.BLOCK``, the default) and once with every layer cast whole (the
behaviour before), each in a fresh process so one peak cannot hide the other.

    python benchmarks/fp64_reference.py [--size tiny|100m|300m|1b] [--dtype fp32|bf16]

The model is benchmarks/scale.py's (transformers' LlamaForCausalLM from a LlamaConfig,
random weights), batch 1, sequence 128; docs/scale.md quotes the figures.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from tabulate import tabulate

ONE = """\
import resource, sys, time, torch
sys.path.insert(0, {here!r})
from scale import SIZES
from transformers import LlamaConfig, LlamaForCausalLM
from gatekeeper.worker import fp64
from gatekeeper.worker.calls import Inputs
from gatekeeper.worker.parity import fp64_reference

if {whole}:
    fp64.BLOCK = 1 << 62  # every layer cast whole, as before
torch.manual_seed(0)
config = LlamaConfig(**SIZES[{size!r}], max_position_embeddings=2048, tie_word_embeddings=False)
model = LlamaForCausalLM(config).eval().to(getattr(torch, {dtype!r}))
ids = torch.randint(0, config.vocab_size, (1, 128))
inputs = Inputs(args=[], kwargs={{"input_ids": ids, "attention_mask": torch.ones_like(ids)}})
built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = time.perf_counter()
out = fp64_reference(model, inputs)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(fp64.weight_bytes(model), built, peak, seconds, out is not None)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="300m", choices=("tiny", "100m", "300m", "1b"))
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    a = ap.parse_args()
    dtype = {"fp32": "float32", "bf16": "bfloat16"}[a.dtype]
    rows = []
    for label, whole in (("every layer cast whole (before)", True), ("by parts (now)", False)):
        code = ONE.format(here=str(Path(__file__).parent), whole=whole, size=a.size, dtype=dtype)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"fp64_reference: {label} failed: {proc.stderr[-2000:]}")
        w, built, peak, seconds, ok = proc.stdout.split()[-5:]
        w, built, peak = int(w), int(built), int(peak)
        rows.append([label, f"{built / w:.2f}", f"{peak / w:.2f}", f"+{(peak - built) / w:.3f}",
                     f"{float(seconds):.1f} s", ok])  # fmt: skip
    print(f"LlamaForCausalLM {a.size}, {a.dtype}: weights {w / 1e9:.2f} GB\n")
    heads = ["reference", "built (x weights)", "after reference", "reference's own", "took", "ran"]
    print(tabulate(rows, headers=heads, tablefmt="github"))


if __name__ == "__main__":
    main()
