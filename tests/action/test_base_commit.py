"""The base commit (a depth-1 pull request checkout pairs with the fetched base; the
fetch never fails the job), the accept label, and bad input values."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from support.action_runner import (
    CONFIG,
    HEAVIER_MODEL,
    MARKER,
    PR,
    REPO,
    WRITE_TOKEN,
    ActionRun,
    CompositeRunner,
    Harness,
    StepRun,
    _pull_request_event,
    _runner_env,
)
from support.github_server import FakeGitHub
from support.helpers import TINY_MODEL, write_project

# ------------------------------------------------------- the base commit, and acceptance


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    ).stdout.strip()


def _has_commit(repo: Path, sha: str) -> bool:
    return (
        subprocess.run(
            ["git", "-C", str(repo), "cat-file", "-e", f"{sha}^{{commit}}"],
            check=False,
            capture_output=True,
        ).returncode
        == 0
    )


@dataclass
class Origin:
    """The repository on the server (a bare one, reached by file://): main, and the pull
    request's branch one commit ahead (the model unchanged, so its bundles are main's)."""

    url: str
    main: str
    feature: str

    def clone(self, dest: Path, branch: str) -> Path:
        """What actions/checkout does by default: depth 1, that one commit only."""
        git(
            dest.parent,
            "clone",
            "-q",
            "--depth=1",
            "--branch",
            branch,
            "--single-branch",
            self.url,
            str(dest),
        )
        return dest


@pytest.fixture
def origin(tmp_path: Path) -> Origin:
    src = write_project(tmp_path / "src", TINY_MODEL, CONFIG)
    git(src, "init", "-q", "-b", "main")
    git(src, "add", ".")
    git(src, "commit", "-qm", "main")
    git(src, "checkout", "-qb", "feature")
    (src / "NOTES.md").write_text("the pull request's change\n")
    git(src, "add", ".")
    git(src, "commit", "-qm", "feature")
    bare = tmp_path / "origin.git"
    git(tmp_path, "clone", "-q", "--bare", str(src), str(bare))
    return Origin(
        f"file://{bare}", git(bare, "rev-parse", "main"), git(bare, "rev-parse", "feature")
    )


def test_a_depth_1_pull_request_checkout_pairs_with_the_fetched_base(
    harness: Harness, origin: Origin, tmp_path: Path
) -> None:
    """What a default actions/checkout leaves (the PR's commit, depth 1) is enough: the
    action fetches the event's base.sha, and gatekeeper measures base and PR in one
    process (paired), against a store that holds main's baseline."""
    store = str(tmp_path / "store")
    main = harness.at(origin.clone(tmp_path / "main-checkout", "main"))
    base = main.push({"command": "baseline", "store": store})
    assert base.outcome == "success", base.log
    assert "nothing to fetch" in base.step("base").log  # a push names no base commit

    workspace = origin.clone(tmp_path / "pr-checkout", "feature")
    assert git(workspace, "rev-parse", "--is-shallow-repository") == "true"
    assert not _has_commit(workspace, origin.main)
    event = _pull_request_event(REPO, base_sha=origin.main, head_sha=origin.feature)
    run = harness.at(workspace).pull_request({"store": store, "comment": "false"}, event=event)
    assert run.outcome == "success", run.log
    fetch = run.step("base")
    assert fetch.outcome == "success" and fetch.outputs.get("fetched") == "true", fetch.log
    assert f"fetched the base commit {origin.main}" in fetch.log
    assert not [a for a in run.annotations("warning") if "base commit" in a], run.log
    assert _has_commit(workspace, origin.main)  # really fetched, and still shallow
    assert git(workspace, "rev-parse", "--is-shallow-repository") == "true"
    assert "--mode auto" in run.step("gatekeeper").log
    results = json.loads(Path(run.outputs["results"]).read_text())
    assert results["mode"] == "paired", results.get("mode_reason")
    assert origin.main[:12] in results["mode_reason"]
    (target,) = results["targets"]
    assert target["paired"]["base_commit"] == origin.main
    report = Path(run.outputs["report"]).read_text()
    assert "paired with" in report and origin.main[:12] in report
    assert run.outputs["verdict"] in ("pass", "improved")
    assert len(git(workspace, "worktree", "list").splitlines()) == 1  # the base's is gone


def test_the_gatekeeper_accept_label_accepts_a_regression(
    harness: Harness, github_api: FakeGitHub, tmp_path: Path
) -> None:
    """A PR whose model does more FLOPs (the deterministic work rule) and carries the label
    gatekeeper:accept: verdict accepted, exit 0, the comment says so. Re-gated (merge)
    without the label it is regressed again; gatekeeper:accept:<glob> and the `accept`
    input accept only matching targets. This workspace is no git checkout: the action says
    it cannot fetch the base, and gatekeeper measures in stored mode and says why."""
    store = str(tmp_path / "store")
    workspace = harness.runner.workspace
    base = harness.push({"command": "baseline", "store": store, "comment": "false"})
    assert base.outcome == "success", base.log

    (workspace / "tinymodel.py").write_text(HEAVIER_MODEL)
    accepted = harness.pull_request(
        {"store": store},
        event=_pull_request_event(REPO, labels=("perf", "gatekeeper:accept"), action="labeled"),
    )
    assert accepted.outcome == "success", accepted.log
    assert accepted.outputs["verdict"] == "accepted"
    assert accepted.step("gatekeeper").outputs["exit-code"] == "0"
    (warning,) = [a for a in accepted.annotations("warning") if "base commit" in a]
    assert warning.startswith("::warning title=gatekeeper::cannot fetch the pull request's")
    assert "not in a git checkout" in warning
    results = json.loads(Path(accepted.outputs["results"]).read_text())
    assert results["mode"] == "stored" and "cannot pair" in results["mode_reason"]
    report = Path(accepted.outputs["report"]).read_text()
    assert "accepted" in report and "FLOPs per call" in report
    assert "stored mode: cannot pair" in report
    (comment,) = github_api.comments_on(REPO, PR)
    assert comment["body"] == f"{MARKER}\n{report}"

    # the same results, gated again the way matrix-gate.yml's merge job does
    shards = tmp_path / "shards"
    shutil.copytree(Path(accepted.outputs["results"]).parent, shards / "gatekeeper-shard-1")

    def merge(labels: tuple[str, ...], **inputs: str) -> ActionRun:
        return harness.pull_request(
            {
                "command": "merge",
                "merge-from": str(shards),
                "store": store,
                "comment": "false",
                **inputs,
            },
            event=_pull_request_event(REPO, labels=labels),
        )

    unlabelled = merge(())
    assert unlabelled.outcome == "failure"
    assert unlabelled.outputs["verdict"] == "regressed"
    assert unlabelled.step("Verdict").returncode == 1
    assert "FLOPs per call" in Path(unlabelled.outputs["report"]).read_text()
    other = merge(("gatekeeper:accept:other/*",))
    assert other.outputs["verdict"] == "regressed" and other.outcome == "failure"
    matching = merge(("gatekeeper:accept:tiny/*",))
    assert matching.outputs["verdict"] == "accepted" and matching.outcome == "success"
    by_input = merge((), accept="other/*\n  tiny/b4/*")
    assert by_input.outcome == "success", by_input.log
    assert by_input.outputs["verdict"] == "accepted"
    assert "--accept=other/* --accept=tiny/b4/*" in by_input.step("gatekeeper").log


class _Recorder(BaseHTTPRequestHandler):
    """A git server that is not there: records what it was sent, answers 404."""

    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:  # http.server's name
        type(self).seen.append({"path": self.path, **dict(self.headers.items())})
        self.send_error(404)

    def log_message(self, *args: Any) -> None:
        pass


def test_the_base_fetch_never_fails_the_job(
    harness: Harness, origin: Origin, tmp_path: Path
) -> None:
    """Each way the fetch can fail is one warning line, and the run goes on (here to a
    quick usage error: the config is absent, so nothing is compiled)."""
    quick = {"config": "absent.toml", "comment": "false"}

    def fetch_step(
        workspace: Path, event: dict[str, Any], inputs: dict[str, str] = quick, **kw: Any
    ) -> StepRun:
        run = harness.at(workspace).pull_request(inputs, event=event, **kw)
        assert run.step("gatekeeper").outputs["exit-code"] == "2", run.log  # it went on
        return run.step("base")

    # a base commit the server does not have (a fork whose base is unreachable)
    shallow = origin.clone(tmp_path / "shallow", "feature")
    missing = "f" * 40
    step = fetch_step(shallow, _pull_request_event("mallory/models", base_sha=missing))
    assert step.outcome == "success" and "fetched" not in step.outputs
    (warning,) = [line for line in step.log.splitlines() if line.startswith("::")]
    assert warning.startswith("::warning title=gatekeeper::cannot fetch")
    assert f"git fetch origin {missing} failed" in warning

    # a checkout without a remote
    lonely = write_project(tmp_path / "lonely", TINY_MODEL, CONFIG)
    git(lonely, "init", "-q", "-b", "feature")
    git(lonely, "add", ".")
    git(lonely, "commit", "-qm", "x")
    step = fetch_step(lonely, _pull_request_event(REPO, base_sha=origin.main))
    assert "has no remote 'origin'" in step.log and step.outcome == "success"

    # an event whose base.sha is no commit id is never handed to git
    step = fetch_step(shallow, _pull_request_event(REPO, base_sha="--upload-pack=touch x"))
    assert "is not a commit id" in step.log and not (shallow / "x").exists()

    # mode stored: nothing is fetched
    run = harness.at(shallow).pull_request(
        {**quick, "mode": "stored"}, event=_pull_request_event(REPO, base_sha=origin.main)
    )
    assert run.step("base").outcome == "skipped"
    assert "--mode stored" in run.step("gatekeeper").log
    assert not _has_commit(shallow, origin.main)

    # checkout's persist-credentials: false leaves no credentials: the fetch from this
    # GitHub server authenticates with the action's token, through git's environment only
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        git(shallow, "remote", "set-url", "origin", f"{url}/{REPO}.git")
        config_before = (shallow / ".git" / "config").read_text()
        step = fetch_step(shallow, _pull_request_event(REPO, base_sha=origin.main), server_url=url)
    finally:
        server.shutdown()
        server.server_close()
    assert step.outcome == "success" and "failed" in step.log
    (request, *_) = _Recorder.seen
    assert request["path"].startswith(f"/{REPO}.git/info/refs")
    basic = base64.b64encode(f"x-access-token:{WRITE_TOKEN}".encode()).decode()
    assert {k.lower(): v for k, v in request.items()}["authorization"] == f"basic {basic}"
    assert WRITE_TOKEN not in step.log
    assert f"::add-mask::{basic}" in step.log
    assert [line for line in step.log.splitlines() if basic in line] == [f"::add-mask::{basic}"]
    assert (shallow / ".git" / "config").read_text() == config_before  # nothing persisted


def test_bad_input_values_are_refused(action_dir: Path, tmp_path: Path) -> None:
    python_bin = Path(sys.executable).parent  # refused before any Python runs
    runner = CompositeRunner(action_dir, tmp_path, tmp_path, _runner_env(python_bin))
    run = runner.run({"command": "rm -rf /"}, github={"event_name": "push", "token": ""})
    assert run.outcome == "failure"
    assert run.step("setup").returncode == 2
    assert "command must be run, baseline, compile, warm or merge" in run.step("setup").log
    run = runner.run({"mode": "fast"}, github={"event_name": "push", "token": ""})
    assert run.step("setup").returncode == 2
    assert "mode must be auto, paired or stored" in run.step("setup").log
