"""A worker ends by ``gatekeeper.worker.end``: ``os._exit`` once what an interpreter's exit
promises is done, skipping only the freeing of every object of torch (about 1.1 s of
every worker's end: docs/benchmarks.md, "A worker's end"). What model code or torch left
to an exit still happens: its ``atexit`` functions run (the box's tests have a factory's
rewrite its answer at exit), its non-daemon threads are joined (a thread pool finishes
the work it was given), and what it printed but did not flush reaches its log.

Run in a fresh interpreter: the test ends it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import atexit, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from gatekeeper.worker import end

out = sys.argv[1]
atexit.register(lambda: open(out + ".atexit", "w").write("ran"))

def late():
    time.sleep(0.3)
    open(out + ".thread", "w").write("joined")

threading.Thread(target=late).start()
pool = ThreadPoolExecutor(1)
pool.submit(lambda: (time.sleep(0.3), open(out + ".pool", "w").write("done")))
sys.stdout.write("unflushed")  # a pipe: block-buffered, not written until flushed
end(int(sys.argv[2]))
print("never")
"""


def test_end_keeps_an_exits_promises_and_its_code(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(out), "3"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "unflushed", proc.stdout
    assert (tmp_path / "out.atexit").read_text() == "ran"
    assert (tmp_path / "out.thread").read_text() == "joined"
    assert (tmp_path / "out.pool").read_text() == "done"


def test_end_of_an_exit_status_past_a_byte_is_that_byte(tmp_path: Path) -> None:
    """As ``sys.exit(n)`` ends a process: its status is ``n`` modulo 256."""
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "out"), "258"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
