"""The parent's reading of a worker that died without answering
(:mod:`gatekeeper.boundary.breadcrumbs`): the signal by name, the step from the breadcrumb, the
model's line from faulthandler's stack. The real crashes: tests/e2e/test_crash.py."""

from __future__ import annotations

import json
from pathlib import Path

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
