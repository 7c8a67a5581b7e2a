"""Who made an artifact: commit, ref and workflow run (from GitHub Actions or git)."""

from __future__ import annotations

import os
import socket
import subprocess


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def current_ref() -> str:
    """The branch a run belongs to: the PR's head branch, the pushed branch, or git's."""
    env = os.environ
    return (
        env.get("GITHUB_HEAD_REF")
        or env.get("GITHUB_REF_NAME")
        or _git("rev-parse", "--abbrev-ref", "HEAD")
        or "local"
    )


def base_ref() -> str:
    """The branch a pull request is gated against (its base), else ``main``."""
    return os.environ.get("GITHUB_BASE_REF") or "main"


def creator() -> dict:
    env = os.environ
    run_url = None
    if env.get("GITHUB_RUN_ID") and env.get("GITHUB_REPOSITORY"):
        server = env.get("GITHUB_SERVER_URL", "https://github.com")
        run_url = f"{server}/{env['GITHUB_REPOSITORY']}/actions/runs/{env['GITHUB_RUN_ID']}"
    return {
        "commit": env.get("GITHUB_SHA") or _git("rev-parse", "HEAD"),
        "ref": current_ref(),
        "repository": env.get("GITHUB_REPOSITORY"),
        "workflow_run": run_url,
        "host": socket.gethostname(),
    }
