"""Sharding is invisible in the verdict: `check --shard 1/2` and `--shard 2/2` merged
give what one unsharded `check` + `gate` gives.

Two targets: two shape sets (batch 4 and 8) of one tiny model, compiled once per
session, with main's baseline published for both. The pull request's model drifts for
batch 8 only (outputs 1% off, switched on by TINY_DRIFT so that the source, and with it
the code hash and the bundle, stay the same): one target passes, the other fails parity.
Timings differ from run to run, so the comparison is of structure and verdicts: the
targets, their verdicts and statuses, the overall verdict and exit code, the rows of the
report's table (target and verdict columns), never a latency. Stored mode compares
processes, and a loaded machine moves the tiny model's timing past even the wide
thresholds, which the gate calls undecided on a run it marks disturbed: what is
compared is the verdict the gate reaches on everything else (:func:`settled`).
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from support.helpers import TIMING_REASONS, gk, parity_only_config, unchanged_passes

MODEL = textwrap.dedent("""
    import os

    import torch
    from torch import nn

    DRIFT = os.environ.get("TINY_DRIFT") == "1"

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(16, 32)
            self.fc2 = nn.Linear(32, 4)

        def forward(self, x):
            out = self.fc2(torch.relu(self.fc1(x)))
            if DRIFT and x.shape[0] == 8:
                out = out * 1.01
            return out

    def make():
        return Tiny()
""")

# the drift switch is an environment variable: the worker's environment is an
# allow-list, so the config passes it on (pass_env), as a user's model setting would be
CONFIG = parity_only_config("[{ batch = 4 }, { batch = 8 }]").replace(
    'store = "store"', 'store = "store"\npass_env = ["TINY_DRIFT"]'
)

TARGETS = ["tiny/b4/default", "tiny/b8/default"]
# one thread: every run has the same env key, and a busy machine cannot turn an OpenMP
# wait into a fake 50x "regression"
ENV = {"OMP_NUM_THREADS": "1", "GITHUB_REF_NAME": "main"}
PR_ENV = {**ENV, "TINY_DRIFT": "1"}


def run_json(*args: str, cwd: Path, env: dict, expect: tuple[int, ...] = (0,)) -> tuple[int, dict]:
    proc = gk(*args, "--json", cwd=cwd, env=env)
    assert proc.returncode in expect, (
        f"gatekeeper {' '.join(args)}: exit {proc.returncode}\n{proc.stderr}"
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture(scope="session")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both targets compiled and published once; main's baseline published for both."""
    root = tmp_path_factory.mktemp("shards")
    (root / "tinymodel.py").write_text(MODEL)
    (root / "gatekeeper.toml").write_text(CONFIG)
    _, doc = run_json("compile", cwd=root, env=ENV)
    assert [t["status"] for t in doc["targets"]] == ["published", "published"], doc
    run_json("check", "--out", "base", "--base-ref", "main", cwd=root, env=ENV)
    _, doc = run_json(
        "baseline", "--results", "base/results.json", "--ref", "main", cwd=root, env=ENV
    )
    assert sorted(t["target"] for t in doc["targets"]) == TARGETS
    return root


def table_rows(report_md: str) -> list[tuple[str, str]]:
    """(target, verdict) of each row of the report's main table."""
    rows = []
    for line in report_md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] in TARGETS:
            rows.append((cells[0], cells[1]))
    return rows


def settled(t: dict) -> tuple[str, list[str]]:
    """A target's verdict and reasons less what timing left undecided: ``inconclusive``
    on a run marked disturbed, on timing reasons alone that name the disturbance (two
    processes on a loaded machine: :func:`unchanged_passes`), is ``pass``. Any other
    verdict, and every other reason, stands as the gate gave it."""
    reasons = [r for r in t["reasons"] if not r.startswith(TIMING_REASONS)]
    if t["verdict"] == "inconclusive" and unchanged_passes(t):
        return "pass", reasons
    return t["verdict"], reasons


def shape(report: dict) -> dict:
    """What must not depend on sharding: verdicts and structure, no timings."""
    verdicts = [t["verdict"] for t in report["targets"]]
    assert {v: c for v, c in report["counts"].items() if c} == Counter(verdicts), report
    return {
        "verdict": report["verdict"],
        "exit_code": report["exit_code"],
        "base_ref": report["base_ref"],
        "counts": Counter(settled(t)[0] for t in report["targets"]),
        "targets": [
            (t["target"], *settled(t), t["status"], t["env_key"], t["code_hash"])
            for t in report["targets"]
        ],
        "removed": report["removed"],
    }


def test_merged_shards_gate_like_one_unsharded_run(project: Path) -> None:
    # two shards, each measuring its half of the targets into its own folder
    for i in (1, 2):
        run_json(
            "check",
            "--shard",
            f"{i}/2",
            "--out",
            f"shard{i}",
            "--base-ref",
            "main",
            cwd=project,
            env=PR_ENV,
        )
    halves = [json.loads((project / f"shard{i}/results.json").read_text()) for i in (1, 2)]
    assert [[t["target"] for t in h["targets"]] for h in halves] == [[TARGETS[0]], [TARGETS[1]]]

    code_merged, merged = run_json(
        "merge",
        "shard1",
        "shard2",
        "--out",
        "merged",
        "--base-ref",
        "main",
        cwd=project,
        env=PR_ENV,
        expect=(1,),
    )

    # the same targets, measured in one process, gated once
    run_json("check", "--out", "whole", "--base-ref", "main", cwd=project, env=PR_ENV)
    code_whole, whole = run_json(
        "gate",
        "--results",
        "whole/results.json",
        "--base-ref",
        "main",
        cwd=project,
        env=PR_ENV,
        expect=(1,),
    )

    assert code_merged == code_whole == 1
    assert shape(merged) == shape(whole)
    assert [(t["target"], settled(t)[0]) for t in merged["targets"]] == [
        ("tiny/b4/default", "pass"),
        ("tiny/b8/default", "parity-failed"),
    ]
    assert merged["verdict"] == "parity-failed"

    md_merged = (project / "merged/report.md").read_text()
    md_whole = (project / "whole/report.md").read_text()
    for md, report in ((md_merged, merged), (md_whole, whole)):  # each row, its verdict
        verdict = {t["target"]: t["verdict"] for t in report["targets"]}
        assert all(verdict[target] in cell for target, cell in table_rows(md)), md
    # worst first
    assert [target for target, _ in table_rows(md_merged)] == ["tiny/b8/default", "tiny/b4/default"]
    assert [target for target, _ in table_rows(md_whole)] == ["tiny/b8/default", "tiny/b4/default"]
    assert md_merged.splitlines()[0] == md_whole.splitlines()[0]  # the headline

    # the merged results.json is self-contained: both targets, their reference outputs
    results = json.loads((project / "merged/results.json").read_text())
    assert [t["target"] for t in results["targets"]] == TARGETS
    for t in results["targets"]:
        assert (project / "merged" / t["reference"]["file"]).is_file()
    whole_results = json.loads((project / "whole/results.json").read_text())
    assert [(t["target"], t["status"]) for t in results["targets"]] == [
        (t["target"], t["status"]) for t in whole_results["targets"]
    ]


def test_a_target_in_two_shards_is_refused(project: Path) -> None:
    # main's check (both targets) named twice: every target is in both "shards"
    proc = gk("merge", "base", "base/results.json", "--out", "dup", cwd=project, env=ENV)
    assert proc.returncode == 2
    assert "tiny/b4/default is in both" in proc.stderr
