"""What a compile used of its cache dir, as the worker's audit hook sees it (real files,
real audit events): what a seeded compile's bundle keeps of its seed."""

from __future__ import annotations

import _ctypes
import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

from gatekeeper.worker.deps import watching_cache


def test_reads_loads_renames_and_a_childs_command_line_count(tmp_path: Path):
    cache = tmp_path / "cache"
    (cache / "fxgraph" / "k1").mkdir(parents=True)
    entry = cache / "fxgraph" / "k1" / "entry"
    entry.write_text("graph")
    (cache / "unused").write_text("never touched")
    kernel = cache / "ef" / "kernel.so"  # a real shared object, loaded as a kernel is
    kernel.parent.mkdir()
    shutil.copyfile(_ctypes.__file__, kernel)
    with watching_cache(cache) as use:
        entry.read_text()
        (cache / "ab").mkdir()
        (cache / "ab" / ".tmp").write_text("kernel")
        os.replace(cache / "ab" / ".tmp", cache / "ab" / "kernel.cpp")
        # inductor's ISA probe loads its cached library in a child: named on its command line
        probe = cache / "cd" / "probe.so"
        code = f'from ctypes import cdll\nprint("would load {probe}")'
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        ctypes.CDLL(str(kernel))
    assert use.used >= {"fxgraph/k1/entry", "ab/kernel.cpp", "cd/probe.so", "ef/kernel.so"}
    assert "unused" not in use.used and not use.failed

    outside = tmp_path / "elsewhere"
    outside.write_text("x")
    with watching_cache(cache, reads_only=True) as reads:
        (cache / "written").write_text("new")  # a write: the diff with the seed finds it
        entry.read_text()
        outside.read_text()  # not under the cache dir
    assert reads.used == {"fxgraph/k1/entry"}, reads.used
