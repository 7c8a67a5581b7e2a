"""The action's whole gate flow against moto's S3 and the GitHub-like server: outputs,
the job summary, the sticky comment and the failures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from support.action_runner import (
    DRIFTED_MODEL,
    MARKER,
    PR,
    READ_TOKEN,
    REPO,
    SIGNING_KEY,
    WRITE_TOKEN,
    Harness,
    _bucket_keys,
)
from support.github_server import FakeGitHub
from support.helpers import unchanged_passes


def test_gate_flow_outputs_summary_sticky_comment_and_failures(
    harness: Harness, github_api: FakeGitHub, s3_bucket_uri: Any, tmp_path: Path
) -> None:
    store = str(s3_bucket_uri)
    workspace = harness.runner.workspace

    # 1. a push to main publishes signed bundles and main's baseline
    base = harness.push({"command": "baseline", "store": store, "signing-key": SIGNING_KEY})
    assert base.outcome == "success", base.log
    assert base.outputs["verdict"] == "no-baseline"
    assert base.outputs["cache-hit"] == "true"
    assert Path(base.outputs["results"]).is_file() and Path(base.outputs["report"]).is_file()
    assert "gatekeeper: no-baseline" in base.summary
    assert SIGNING_KEY in base.masks and WRITE_TOKEN in base.masks
    assert not [
        line
        for line in base.log.splitlines()
        if SIGNING_KEY in line and not line.startswith("::add-mask::")
    ]
    keys = _bucket_keys(s3_bucket_uri)
    assert any(k.startswith("gk/bundles/tiny/b4/default/") for k in keys)
    assert any(
        k.startswith("gk/baselines/tiny/b4/default/") and k.endswith("/main/latest.json")
        for k in keys
    )
    assert "not a pull request event" in base.step("Comment on the pull request").log
    assert "GATEKEEPER_ACTION_SKIP_INSTALL=true" in base.step("setup").log

    # 2. a deploy warms its cache from the signed bundles
    cache = tmp_path / "inductor-cache"
    warm = harness.push(
        {"command": "warm", "store": store, "signing-key": SIGNING_KEY, "read-only": "true"},
        job_env={"TORCHINDUCTOR_CACHE_DIR": str(cache)},
    )
    assert warm.outcome == "success", warm.log
    assert warm.outputs["cache-hit"] == "true"
    assert warm.outputs["verdict"] == "" and warm.outputs["report"] == ""
    assert any(cache.rglob("*")), "warm restored nothing"
    assert warm.step("Comment on the pull request").outcome == "skipped"

    # 3. a pull request with the same model passes and gets one sticky comment
    first = harness.pull_request({"store": store})
    assert first.outcome == "success", first.log
    assert "read-only: auto -> false" in first.step("gatekeeper").log
    # stored mode compares two processes: under load an unchanged target may be
    # undecided on timing alone, and only on a run the gate marked disturbed
    (gated,) = json.loads(Path(first.outputs["report"]).with_suffix(".json").read_text())["targets"]
    assert first.outputs["verdict"] == gated["verdict"], (first.outputs, gated)
    assert gated["verdict"] == "improved" or unchanged_passes(gated), gated
    assert first.outputs["cache-hit"] == "true"
    report = Path(first.outputs["report"]).read_text()
    results = json.loads(Path(first.outputs["results"]).read_text())
    assert [t["target"] for t in results["targets"]] == ["tiny/b4/default"]
    assert report.strip() and report.strip() in first.summary
    (comment,) = github_api.comments_on(REPO, PR)
    assert comment["body"] == f"{MARKER}\n{report}"
    assert comment["user"]["login"] == "github-actions[bot]"

    # 3b. `command: merge` gates shard results folders (here: that run's, as one shard,
    #     laid out as download-artifact lays out several artifacts)
    shards = tmp_path / "shards"
    shutil.copytree(Path(first.outputs["results"]).parent, shards / "gatekeeper-shard-1")
    merged = harness.pull_request(
        {"command": "merge", "merge-from": str(shards), "store": store, "comment": "false"}
    )
    assert merged.outcome == "success", merged.log
    assert "merging 1 shard(s)" in merged.step("gatekeeper").log
    assert merged.outputs["verdict"] == first.outputs["verdict"]
    assert (
        json.loads(Path(merged.outputs["results"]).read_text())["targets"][0]["target"]
        == "tiny/b4/default"
    )
    (shards / "empty").mkdir()
    nothing = harness.pull_request(
        {
            "command": "merge",
            "merge-from": str(shards / "empty"),
            "comment": "false",
            "fail-on-regression": "false",
        }
    )
    assert nothing.outcome == "failure"
    assert "no shard results" in nothing.step("gatekeeper").log

    # 4. a PR whose outputs drifted: the gate fails, the comment is still updated (in
    #    place), then the step fails
    (workspace / "tinymodel.py").write_text(DRIFTED_MODEL)
    failing = harness.pull_request({"store": store})
    assert failing.outcome == "failure"
    assert failing.outputs["verdict"] == "parity-failed"
    assert failing.step("gatekeeper").outcome == "success"  # recorded, not failed
    assert failing.step("gatekeeper").outputs["exit-code"] == "1"
    assert failing.step("Comment on the pull request").outcome == "success"
    assert failing.step("Verdict").outcome == "failure"
    assert failing.step("Verdict").returncode == 1
    assert any("parity-failed" in a for a in failing.annotations("error"))
    (updated,) = github_api.comments_on(REPO, PR)
    assert updated["id"] == comment["id"]
    assert "parity-failed" in updated["body"]
    assert updated["body"] == f"{MARKER}\n{Path(failing.outputs['report']).read_text()}"

    # 5. the same from a fork: read-only token and store; fail-on-regression false keeps
    #    exit 1 from failing the step; the comment is skipped, saying who will post it
    keys_before = _bucket_keys(s3_bucket_uri)
    fork = harness.pull_request(
        {"store": store, "fail-on-regression": "false"},
        head_repo="mallory/models",
        token=READ_TOKEN,
    )
    assert fork.outcome == "success", fork.log
    assert fork.outputs["verdict"] == "parity-failed"
    assert "read-only: auto -> true" in fork.step("gatekeeper").log
    comment_log = fork.step("Comment on the pull request").log
    assert "comment skipped" in comment_log and "fork-comment.yml" in comment_log
    assert "Traceback" not in fork.log
    assert any("fail-on-regression: false" in a for a in fork.annotations("warning"))
    assert github_api.comments_on(REPO, PR) == [updated]
    assert _bucket_keys(s3_bucket_uri) == keys_before

    # 6. an error (exit 2) fails the step even with fail-on-regression false
    broken = harness.pull_request(
        {"store": store, "config": "missing.toml", "fail-on-regression": "false"}
    )
    assert broken.outcome == "failure"
    assert broken.step("gatekeeper").outputs["exit-code"] == "2"
    assert broken.step("Verdict").returncode == 2
    assert broken.step("Comment on the pull request").outcome == "skipped"
    assert broken.outputs["verdict"] == ""
    assert github_api.comments_on(REPO, PR) == [updated]
