"""The parent's reading of a worker that died without answering
(:mod:`gatekeeper.boundary.breadcrumbs`): the signal by name, the step from the breadcrumb, the
model's line from faulthandler's stack. The real crashes: tests/e2e/test_crash.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gatekeeper import kinds
from gatekeeper.boundary import breadcrumbs

AOT = kinds.get("aot")  # the kind whose deaths in AOTInductor's steps are `unavailable`

FAULT = """\
some earlier output
Fatal Python error: Segmentation fault

Current thread 0x00007f3a (most recent call first):
  File "{stdlib}/ctypes/__init__.py", line 519 in string_at
  File "{base}/models/net.py", line 14 in forward
  File "{torch}/nn/modules/module.py", line 1775 in _call_impl
  File "{ours}/worker/timing.py", line 35 in first_call
"""


def fault_log(base: Path) -> str:
    import ctypes

    import torch

    import gatekeeper

    return FAULT.format(
        stdlib=Path(ctypes.__file__).parent.parent,
        base=base,
        torch=Path(torch.__file__).parent,
        ours=Path(gatekeeper.__file__).parent,
    )


def test_the_breadcrumb_is_the_last_step_entered(tmp_path, monkeypatch):
    response = tmp_path / "response.json"
    monkeypatch.setattr(breadcrumbs, "_path", None)
    breadcrumbs.enter("nowhere")  # outside a worker: nothing written
    assert not breadcrumbs.breadcrumb(response).exists()
    breadcrumbs.begin(response)
    breadcrumbs.enter("build model")
    breadcrumbs.enter("load package")
    doc = json.loads(breadcrumbs.breadcrumb(response).read_text())
    assert doc["step"] == "load package"
    death = breadcrumbs.read(response, -11)
    assert (death.signal, death.step) == ("SIGSEGV", "load package")
    assert "torch's AOTInductor killed the worker (SIGSEGV) in load package" in (
        AOT.died(death, "cpu") or ""
    )
    assert kinds.get("whole").died(death, "cpu") is None  # only a kind's own deaths
    monkeypatch.setattr(breadcrumbs, "_path", None)


def test_a_death_is_one_line_naming_the_signal_step_and_the_models_line(tmp_path):
    base = tmp_path / "project"
    death = breadcrumbs.read(tmp_path / "none.json", -11, fault_log(base), base)
    assert death.frame == "models/net.py:14"  # ctypes, torch and gatekeeper skipped
    assert breadcrumbs.describe(death, "ignored") == (
        "worker died by SIGSEGV (segmentation fault) at models/net.py:14"
    )
    killed = breadcrumbs.Death(-9, "measure")
    assert breadcrumbs.describe(killed, "x") == (
        "worker died by SIGKILL (killed: out of memory, or by another process) in measure"
    )
    assert breadcrumbs.describe(breadcrumbs.Death(-6, "export"), "x").startswith(
        "worker died by SIGABRT (aborted) in export"
    )
    exited = breadcrumbs.Death(3, "build model")
    assert exited.signal is None and AOT.died(exited, "cpu") is None
    assert breadcrumbs.describe(exited, "SystemExit: 3") == (
        "worker exited with code 3 in build model: SystemExit: 3"
    )
    # a signal outside AOTInductor's steps is the model's or torch's error, not aot's
    assert AOT.died(breadcrumbs.Death(-11, "first call"), "cpu") is None


def test_no_faulthandler_stack_no_frame(tmp_path):
    assert (
        breadcrumbs.crash_frame('Traceback (most recent call last):\n  File "x.py", line 1') is None
    )
    assert breadcrumbs.read(tmp_path / "r.json", 1, "").frame is None


# torch's fatal signal handler (c10::FatalSignalHandler) after faulthandler's stack, as
# the worker of issue 53's crash wrote it (trimmed): the crashing thread (the one in
# fatalSignalHandler), then another; faulthandler re-raised the signal (gsignal)
NATIVE = Path(__file__).parent / "data" / "native_crash.log"  # {torch}: its folder


def test_the_native_frame_is_the_crashing_threads_innermost_outside_libc():
    import torch

    log = NATIVE.read_text().format(torch=Path(torch.__file__).parent)
    assert breadcrumbs.native_frame(log) == (
        "ctxqsd2q....wrapper.so+0x7f011 in cpp_fused_add_embedding_mean_mul_pow_rsqrt_0 "
        "(ctxqsd2q....wrapper.so)"
    )
    death = breadcrumbs.read(Path("none.json"), -11, log)
    assert breadcrumbs.describe(breadcrumbs.Death(-11, "measure", native=death.native), "") == (
        "worker died by SIGSEGV (segmentation fault) in measure; native frame: "
        "ctxqsd2q....wrapper.so+0x7f011 in cpp_fused_add_embedding_mean_mul_pow_rsqrt_0 "
        "(ctxqsd2q....wrapper.so)"
    )
    # a named frame: its function without parameters, template arguments or return type
    named = log.replace(
        "<unknown function> + 0x7f011",
        "void at::native::copy_<float, std::vector<int>>(at::Tensor&, bool) const + 0x1f",
    )
    assert breadcrumbs.native_frame(named) == "at::native::copy_<...> (ctxqsd2q....wrapper.so)"
    # Python code that crashed (a ctypes call): the interpreter's frames only, none named
    python = "\n".join(ln for ln in log.splitlines() if "#6:" not in ln and "#7:" not in ln)
    python = python.replace("frame #8:", "<omitting python frames>\nframe #8:")
    assert breadcrumbs.native_frame(python) is None
    assert breadcrumbs.native_frame("Fatal Python error: Segmentation fault\n") is None


CRASH = """\
import ctypes, os, sys
from pathlib import Path

import pytest
from gatekeeper.boundary import breadcrumbs
import faulthandler
faulthandler.enable(all_threads=False)  # as the worker does, before it imports torch
breadcrumbs.begin(Path(sys.argv[1]))
import torch
breadcrumbs.enter("measure")  # torch imported: its handler armed
if sys.argv[2] == "abort":
    os.abort()
torch.set_num_threads(1)  # one thread reads it: two crashing at once race their handlers
import mmap
# 64 MiB of a mapping of its own (not the C library's heap, whose bookkeeping an unmap
# under it would corrupt: the crash then ended in "double free" and SIGABRT inside the
# handlers), unmapped behind torch's back
buf = mmap.mmap(-1, 1 << 26)
t = torch.frombuffer(buf, dtype=torch.float32)
ctypes.CDLL(None).munmap(ctypes.c_void_p(t.data_ptr()), ctypes.c_size_t(1 << 26))
print(t.sum())
"""


@pytest.mark.parametrize("how", ["segv", "abort"])
def test_a_worker_that_crashed_in_torchs_cpp_names_the_native_frame(tmp_path, how):
    """A real crash in torch's C++ (a sum over memory unmapped under it) in a process
    that armed torch's handler as a worker does: it still dies by the signal, and its
    line names the native frame; an abort stays faulthandler's alone (torch's handler
    could hang on a heap glibc aborted on)."""
    import subprocess
    import sys

    response = tmp_path / "response.json"
    proc = subprocess.run(
        [sys.executable, "-c", CRASH, str(response), how],
        capture_output=True,
        text=True,
        timeout=300,
    )
    death = breadcrumbs.read(response, proc.returncode, proc.stderr)
    assert death.step == "measure", proc.stderr[-3000:]
    line = breadcrumbs.describe(death, "")
    if how == "abort":
        assert death.signal == "SIGABRT" and "FatalSignalHandler" not in proc.stderr, line
        assert death.native is None and "Fatal Python error: Aborted" in proc.stderr
        return
    assert death.signal == "SIGSEGV", proc.stderr[-3000:]
    assert "Fatal Python error: Segmentation fault" in proc.stderr  # faulthandler's first
    assert re.search(r"; native frame: .*libtorch_cpu\.so", line), (line, proc.stderr[-3000:])
    assert "\n" not in line
