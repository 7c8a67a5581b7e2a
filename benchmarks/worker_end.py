"""How long a worker takes to end once its work is done: a fresh interpreter imports
torch, Dynamo and inductor, compiles one small function on the CPU (what every compile
worker has loaded by its end), then ends either as an interpreter ends (``sys.exit``:
every object freed one by one) or by ``gatekeeper.worker.end`` (threads joined, ``atexit``
functions run, streams flushed, ``os._exit``). The figure is the time from the work's
last line to the process's exit as its parent sees it (the parent waits for it before
it reads the answer), alternating the two ends, median of ``--rounds``.

    python benchmarks/worker_end.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

WORK = """
import sys, time
import torch, torch._dynamo, torch._inductor.compile_fx
f = torch.compile(lambda x: (torch.sin(x) + 1).sum(-1))
f(torch.randn(8, 64))
print(time.time(), flush=True)
if sys.argv[1] == "end":
    from gatekeeper.worker import end
    end(0)
sys.exit(0)
"""


def one(how: str, cache: str) -> float:
    proc = subprocess.Popen(
        [sys.executable, "-c", WORK, how],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache},
    )
    assert proc.stdout is not None
    last = float(proc.stdout.readline())
    proc.wait()
    ended = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"the {how} run exited {proc.returncode}")
    return ended - last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"interpreter": [], "end": []}
    with tempfile.TemporaryDirectory() as cache:
        one("end", cache)  # warm-up: the kernel compiled once, later runs load it
        for i in range(args.rounds):
            order = ("interpreter", "end") if i % 2 == 0 else ("end", "interpreter")
            for how in order:
                times[how].append(one(how, cache))
    a, b = (statistics.median(times[k]) for k in ("interpreter", "end"))
    print("| end | median s (to the parent's wait) |")
    print("|---|---|")
    print(f"| interpreter's exit | {a:.3f} |")
    print(f"| gatekeeper.worker.end | {b:.3f} |")
    print(f"| saved per worker | {a - b:.3f} ({b / a:.2f}x) |")


if __name__ == "__main__":
    main()
