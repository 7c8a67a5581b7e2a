"""The worker hands the heap's free pages back between a measurement's steps
(gatekeeper.worker.memory.give_back): without it, what a build or a compile freed stays
resident and the next step's peak stands on it (the 1B model's paired peak, docs/scale.md).

Run in a fresh interpreter so that the heap's state is this test's alone."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

# Tensors of 2 MiB land on glibc's heap once a freed 16 MiB mmap has raised its dynamic
# threshold; a smaller one kept after each (too big for glibc's free lists, so it comes
# from the heap's top) leaves the freed ones in the middle of the heap, where glibc's own
# trimming (the top of the heap only) cannot reach them.
SCRIPT = """
import sys, torch
from gatekeeper.worker.memory import give_back

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

torch.ones(4 << 20)  # 16 MiB, mmapped and freed at once: the threshold rises to it
big, small = [], []
for _ in range(256):
    big.append(torch.ones(512 << 10))  # 2 MiB each, 512 MiB in all
    small.append(torch.ones(64 << 10))  # 256 KiB, kept: it pins the 2 MiB before it
del big
before = rss()
if sys.argv[1] == "give-back":
    give_back()
print(before - rss())
"""


def _glibc() -> bool:
    try:
        return hasattr(ctypes.CDLL(None), "malloc_trim")
    except OSError:
        return False


@pytest.mark.skipif(not _glibc(), reason="glibc's malloc_trim only")
@pytest.mark.e2e  # a worker or a fresh interpreter importing torch
def test_the_heaps_freed_pages_go_back_to_the_kernel() -> None:
    def returned(how: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT, how], capture_output=True, text=True, check=True
        )
        return int(out.stdout.split()[-1])

    # without it, the 512 MiB freed stay resident; with it, nearly all of it leaves
    assert returned("keep") < 64 << 20
    assert returned("give-back") > 400 << 20
