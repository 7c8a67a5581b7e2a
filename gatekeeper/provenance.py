"""Who made an artifact: commit, ref and workflow run (from GitHub Actions or git)."""

from __future__ import annotations

import os
import socket

from .git import try_git


def current_ref() -> str:
    """The branch a run belongs to: the PR's head branch, the pushed branch, or git's."""
    env = os.environ
    return (
        env.get("GITHUB_HEAD_REF")
        or env.get("GITHUB_REF_NAME")
        or try_git(None, "rev-parse", "--abbrev-ref", "HEAD", timeout=10)
        or "local"
    )


def creator() -> dict:
    env = os.environ
    run_url = None
    if env.get("GITHUB_RUN_ID") and env.get("GITHUB_REPOSITORY"):
        server = env.get("GITHUB_SERVER_URL", "https://github.com")
        run_url = f"{server}/{env['GITHUB_REPOSITORY']}/actions/runs/{env['GITHUB_RUN_ID']}"
    return {
        "commit": env.get("GITHUB_SHA") or try_git(None, "rev-parse", "HEAD", timeout=10),
        "ref": current_ref(),
        "repository": env.get("GITHUB_REPOSITORY"),
        "workflow_run": run_url,
        "host": socket.gethostname(),
    }
