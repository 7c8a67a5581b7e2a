"""The header worker keeps the ISA check programs even in a process that inherited the
check's answer (a worker server's child, after the server ran the check for its model
workers: gatekeeper/worker/imports.py). Real compiles of inductor's check programs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import os, sys
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(sys.argv[1], "first")
from gatekeeper.worker.imports import check_isa, preload
preload(); check_isa()  # as the server does before it forks its first model's worker
from gatekeeper.worker import headers
from torch._inductor import cpu_vec_isa
print("first", headers.keep_isa_check(os.path.join(sys.argv[1], "kept-first")))
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(sys.argv[1], "later")  # the header worker's
cpu_vec_isa.pick_vec_isa()
print("remembered", headers.keep_isa_check(os.path.join(sys.argv[1], "kept-remembered")))
headers.forget_isa_check()  # what the header worker's main does first
cpu_vec_isa.pick_vec_isa()
print("forgotten", headers.keep_isa_check(os.path.join(sys.argv[1], "kept-forgotten")))
"""


@pytest.mark.e2e
def test_a_header_worker_forked_after_the_check_still_builds_the_programs_it_keeps(
    tmp_path: Path,
):
    """A process that ran the check, then compiles in a new cache dir as the header
    worker does: with the inherited answer it builds no program and keeps none (every
    later worker of the machine would then build its own); once it forgets the answer
    (``headers.forget_isa_check``, which the header worker calls first) it builds and
    keeps every one the first check built."""
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    kept = {w: int(n) for w, n in (ln.split() for ln in proc.stdout.splitlines() if ln)}
    assert kept["first"] > 0, kept
    assert kept["remembered"] == 0, kept
    assert kept["forgotten"] == kept["first"], kept
