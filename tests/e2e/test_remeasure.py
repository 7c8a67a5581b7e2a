"""A re-measured target keeps its reference outputs consistent with the sha256 in its
results, so ``run --publish`` stores a baseline that verifies.

Real compiles and measurements (``pipeline.run`` in this process, its workers in new
ones). The one stand-in: the first gate marks the target borderline, which real timings
do only by chance. The model's weights come from an unseeded source, as outputs of
nondeterministic kernels (CUDA atomics) would: each run's reference outputs differ.
"""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

import pytest
from support.helpers import TINY_CONFIG, TINY_MODEL, write_project

from gatekeeper import pipeline
from gatekeeper.check.paired import Mode
from gatekeeper.hashing import sha256_file
from gatekeeper.project import expand, load_config
from gatekeeper.results import Results
from gatekeeper.store import baselines, maintenance, open_store

TARGET = "tiny/b4/default"
MODEL = TINY_MODEL.replace(
    "def make():\n    return Tiny()",
    textwrap.dedent("""
    def make():
        import os
        torch.manual_seed(int.from_bytes(os.urandom(4), "little"))  # differs run to run
        return Tiny()"""),
)
CONFIG = TINY_CONFIG + "\n[tool.gatekeeper.measure]\nwarmup = 2\nmin_time = 0.3\n"


def test_publish_after_a_remeasure_stores_outputs_that_match_their_sha256(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    assert MODEL != TINY_MODEL
    project = write_project(tmp_path / "project", model=MODEL, config=CONFIG)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    config = load_config(project / "gatekeeper.toml")
    store = open_store(str(project / "store"))
    judge = pipeline.judge
    reports = []

    def first_one_borderline(*args, **kwargs):
        report = judge(*args, **kwargs)
        if not reports:
            for row in report.rows:
                row.verdict.borderline = True
        reports.append(report)
        return report

    monkeypatch.setattr(pipeline, "judge", first_one_borderline)
    out = tmp_path / "out"
    outcome = pipeline.run(
        expand(config),
        config,
        store,
        out_dir=out,
        base_ref="main",
        mode=Mode("stored", "stored mode: a test"),
    )
    assert outcome.report.remeasured == [TARGET] and len(reports) == 2
    (result,) = outcome.results.targets
    assert result.status == "ok" and result.reference is not None
    assert result.latency is not None and len(result.latency.runs or []) == 2  # pooled
    # the file in out/ is the one the results name, on disk as in memory
    assert sha256_file(out / result.reference.file) == result.reference.sha256
    on_disk = Results.model_validate_json((out / "results.json").read_text())
    assert on_disk.targets[0].reference == result.reference
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == sorted(
        ["results.json", Path(result.reference.file).name, Path(result.profile.trace).name]
    )  # no second run's leftovers

    rows = pipeline.publish(outcome, store, "main")
    assert [r["status"] for r in rows] == ["published"]
    assert not [f for f in maintenance.verify(store, None) if not f.ok]
    doc = baselines.fetch(store, baselines.BaselineKey(TARGET, result.env_key, "main"))
    assert doc is not None and doc.reference_key is not None
    got = store.read(doc.reference_key)
    assert got is not None
    assert (
        hashlib.sha256(got[0]).hexdigest() == doc.result.reference.sha256 == result.reference.sha256
    )
