"""A worker killed by a signal (issue 31): its target's error is one line naming the
signal, the step the worker was in and the model's line, and the other targets go on;
an +aot target whose package takes its worker down inside AOTInductor is `unavailable`
with torch's version and the device, not an error.

Real workers crash for real: a factory and a forward that read address 0
(``ctypes.string_at(0)``), and a custom operator that does so only when it really runs
(export and AOTInductor's build trace it with its fake kernel), so the +aot package
builds and loads, then dies in its first call.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest
from support.helpers import TINY_MODEL, gk, write_project

MODEL = TINY_MODEL + textwrap.dedent("""
    import ctypes


    class Poke(Tiny):
        def forward(self, x):
            ctypes.string_at(0)  # POKE
            return super().forward(x)


    def make_boom():
        ctypes.string_at(0)  # BOOM


    def make_poke():
        return Poke()


    @torch.library.custom_op("gktest::poke", mutates_args=())
    def poke(x: torch.Tensor) -> torch.Tensor:
        ctypes.string_at(0)  # OP
        return x.clone()


    @poke.register_fake
    def _(x):
        return torch.empty_like(x)


    class WithOp(Tiny):
        def forward(self, x):
            return torch.ops.gktest.poke(super().forward(x))


    def make_op():
        return WithOp()
""")

CONFIG = textwrap.dedent("""
    [tool.gatekeeper]
    store = "store"
    precompile = "off"

    [tool.gatekeeper.measure]
    warmup = 1
    min_time = 0.2
""") + "".join(
    f'\n[[tool.gatekeeper.models]]\nname = "{name}"\nfactory = "tinymodel:{factory}"\n'
    f"inputs = [{{ shape = [2, 16] }}]\n{extra}"
    for name, factory, extra in (
        ("boom", "make_boom", ""),
        ("poke", "make_poke", ""),
        ("tiny", "make", ""),
        ("op", "make_op", 'strategies = ["aot"]\n'),
    )
)


def _line(marker: str) -> int:
    return next(i for i, ln in enumerate(MODEL.splitlines(), 1) if f"# {marker}" in ln)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    project = write_project(tmp_path_factory.mktemp("crash"), MODEL, CONFIG)
    proc = gk("compile", "--json", cwd=project)
    assert "Traceback" not in proc.stderr, proc.stderr
    return project, proc


def test_a_signal_is_the_targets_one_line_error_naming_it_and_the_step(compiled):
    _, proc = compiled
    assert proc.returncode == 2, proc.stderr  # two targets failed: an error, not a gate
    targets = {t["target"]: t for t in json.loads(proc.stdout)["targets"]}
    boom, poke = targets["boom/fixed/default"], targets["poke/fixed/default"]
    assert boom["status"] == "error" and poke["status"] == "error"
    assert boom["error"] == (
        "boom/fixed/default: worker died by SIGSEGV (segmentation fault) in build model "
        f"at tinymodel.py:{_line('BOOM')}"
    )
    assert poke["error"] == (
        "poke/fixed/default: worker died by SIGSEGV (segmentation fault) in first call "
        f"at tinymodel.py:{_line('POKE')}"
    )
    for err in (boom["error"], poke["error"]):
        assert "\n" not in err and "code -11" not in err
    # the other targets went on
    assert targets["tiny/fixed/default"]["status"] == "published", targets["tiny/fixed/default"]


def test_an_aot_package_that_kills_its_worker_is_unavailable_not_an_error(compiled):
    project, proc = compiled
    op = {t["target"]: t for t in json.loads(proc.stdout)["targets"]}["op/fixed/default+aot"]
    assert op["status"] == "unavailable", op
    assert re.fullmatch(
        r"unavailable: torch's AOTInductor killed the worker \(SIGSEGV\) in package first "
        r"call with torch \S+ on cpu; the target's other strategies are unaffected",
        op["error"],
    ), op["error"]
    assert "op/fixed/default+aot: unavailable: torch's AOTInductor" in proc.stderr
    # check: the same, as the target's status; nothing to compare with, so no verdict
    out = project / "out"
    checked = gk("check", "--target", "op/*", "--out", str(out), cwd=project)
    assert checked.returncode == 0, checked.stderr
    doc = json.loads((out / "results.json").read_text())
    (result,) = doc["targets"]
    assert result["status"] == "unavailable" and result["error"].startswith("unavailable: ")
    assert "package first call" in result["error"]
