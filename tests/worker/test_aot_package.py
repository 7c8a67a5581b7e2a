"""An AOTInductor package whose program calls a custom op of Python
(``torch.library.custom_op``): torch's runtime calls the op through Python and finds
none that no module defined in the process that loads it. A stock Mixtral's aot
generation calls transformers' ``grouped_mm_fallback``: its check passed (the worker
had imported transformers) and a deploy's ``load_aot`` failed ("Could not find schema
for transformers::grouped_mm_fallback"). The package records each such op with its
module (gatekeeper/kinds/aot/worker_build.py), and loading imports the module first
(gatekeeper/runtime.py). One AOTInductor build of a one-op module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import torch

from gatekeeper.config import ModelConfig
from gatekeeper.kinds.aot.worker_build import package_of
from gatekeeper.worker.calls import Inputs
from gatekeeper.worker.kinds import Job

# the op's namespace is its module's package, as transformers' is
OPS = """
import torch


@torch.library.custom_op("gkops::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x):
    return torch.empty_like(x)
"""
LOAD = """
import json, sys, torch
from gatekeeper.runtime import load_package
before = "gkops" in sys.modules
out = load_package({path!r})(torch.ones(4))
print(json.dumps({{"before": before, "out": out.tolist()}}))
"""


class _Twice(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.gkops.twice(x) + 1


def test_a_package_calling_a_python_custom_op_loads_where_its_module_was_never_imported(
    tmp_path, monkeypatch
):
    (tmp_path / "gkops.py").write_text(OPS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import gkops  # noqa: F401  (defines the op, as the model's library does)

    model = _Twice()
    program = torch.export.export(model, (torch.randn(4),))
    cfg = ModelConfig(name="m", factory="gkops:make", inputs=[{"shape": [4]}])
    req = SimpleNamespace(model=cfg, mode="default")
    job = Job(model, Inputs(args=(torch.randn(4),)), req, out=tmp_path / "m.pt2")  # type: ignore[arg-type]
    _, doc = package_of(program, model, model, job)
    assert doc["python_ops"] == ["gkops::twice"], doc

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    code = LOAD.format(path=str(tmp_path / "m.pt2"))
    ran = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    found = json.loads(ran.stdout.strip().splitlines()[-1])
    assert found == {"before": False, "out": [3.0, 3.0, 3.0, 3.0]}, found
