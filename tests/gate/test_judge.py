"""The judge against a real local store: which baselines' targets a report lists as
removed since the baseline."""

from __future__ import annotations

from pathlib import Path

from support.factories import make_baseline, make_result, make_results

from gatekeeper.gate.judge import judge
from gatekeeper.project import expand, load_config
from gatekeeper.store import baselines, open_store

CONFIG = """\
[tool.gatekeeper]
store = "store"

[[tool.gatekeeper.models]]
name = "a"
factory = "m:make"
inputs = [{ shape = [4, 16] }]

[[tool.gatekeeper.models]]
name = "b"
factory = "m:make"
inputs = [{ shape = [4, 16] }]
"""


def test_a_target_the_run_left_out_is_not_removed_only_one_the_config_dropped(tmp_path: Path):
    """``--target`` or ``--shard`` measures some of the config's targets: the others'
    baselines are still the config's, not "removed since the baseline" (the real-size
    benchmark's ``run --target ...+aot`` listed the whole target so). A baseline whose
    target the config no longer defines is."""
    (tmp_path / "pyproject.toml").write_text(CONFIG)
    config = load_config(cwd=tmp_path)
    ids = sorted(t.id for t in expand(config))
    assert len(ids) == 2, ids
    store = open_store("store", base_dir=tmp_path)
    measured = make_result(ids[0], seed=1)
    for target in [*ids, "gone/b4/default"]:
        doc = make_baseline(make_result(target, seed=2))
        assert doc.env_key == measured.env_key
        key = baselines.BaselineKey(target, doc.env_key, "main")
        assert baselines.publish(store, key, doc) == "published"
    results = make_results([measured])
    report = judge(results, config, store, base_ref="main")
    assert report.removed == ["gone/b4/default"], report.removed
    assert [row.result.target for row in report.rows] == [ids[0]]
