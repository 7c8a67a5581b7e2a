"""The action's steps as the runner runs them, with the signing key, the store's write
credentials and the job's token: a model whose factory walks every ancestor and reads
what it can of each (tests/support/snoop.py) finds none of them, and cannot plant code
where the action's later steps, or gatekeeper itself, import from."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from support.action_runner import SIGNING_KEY, WRITE_TOKEN, Harness
from support.snooping import (
    assert_boxed,
    assert_confined,
    assert_found_nothing,
    snoop_project,
    snooped,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc and prctl are Linux's")

AWS_SECRET = "aws-write-secret-needle-e41f"  # moto takes any secret


def test_model_code_run_by_the_action_finds_no_secret(
    harness: Harness, s3_bucket_uri: Any, tmp_path: Path
) -> None:
    workspace = harness.runner.workspace
    config = (workspace / "gatekeeper.toml").read_text()
    needles = {"signing-key": SIGNING_KEY, "token": WRITE_TOKEN, "aws": AWS_SECRET}
    # the action's venv, made by the install step (`installed`), first on the runner's PATH
    venv = Path(harness.runner.base_env["PATH"].split(os.pathsep)[0]).parent
    site = next(venv.glob("lib/python*/site-packages"))
    snoop_project(workspace, needles, config, plant=[str(site), str(venv / "bin")])
    run = harness.push(
        {
            "command": "compile",
            "store": str(s3_bucket_uri),
            "signing-key": SIGNING_KEY,
            "read-only": "false",
            "comment": "false",
        },
        job_env={"AWS_SECRET_ACCESS_KEY": AWS_SECRET},
    )
    assert run.outcome == "success", run.log
    assert run.step("gatekeeper").outputs["exit-code"] == "0", run.log
    doc = snooped(workspace)
    assert_boxed(doc)  # no process outside its box to read, the runner (this test) included
    assert_found_nothing(doc)
    assert_confined(doc["status"])
    # the action's venv (what the comment step and gatekeeper itself import) stays as it was
    assert set(doc["planted"].values()) == {"refused: Read-only file system"}, doc["planted"]
