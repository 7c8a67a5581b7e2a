"""The light workflows' install step, run for real, then the command each workflow runs.

fork-comment.yml and dashboard-pages.yml install gatekeeper without torch: their
"Install the gatekeeper CLI" step runs here as written, in a fresh virtual environment,
with this checkout as the gatekeeper checkout it names (``GATEKEEPER_SRC``); pip fetches
the pinned dependencies and checks their hashes. Then the workflow's own next step runs:
``gatekeeper comment`` against the GitHub-like server (with a stand-in for the GitHub
CLI's one ``gh api`` call), ``gatekeeper dashboard`` against a local store. One venv
for both (the two steps are the same script), so pip downloads once per session.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.factories import make_result
from support.github_server import FakeGitHub

from gatekeeper.gate.baseline import publish_result
from gatekeeper.store import open_store

ROOT = Path(__file__).resolve().parents[1]
LIGHT = ("fork-comment.yml", "dashboard-pages.yml")
INSTALL = "Install the gatekeeper CLI"
REPO = "acme/models"
TOKEN = "ghs_fork_comment_token"
HEAD_SHA = "a" * 40


def _step(workflow: str, name: str) -> dict:
    doc = yaml.safe_load((ROOT / "workflows" / workflow).read_text())
    steps = [s for job in doc["jobs"].values() for s in job.get("steps", [])]
    (step,) = [s for s in steps if s.get("name") == name]
    return step


def _clean_env(bin_dir: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME") and not k.startswith("GITHUB_")
    }
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    return env | extra


def _run(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module")
def light_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv after the light workflows' install step, run as written."""
    scripts = {w: _step(w, INSTALL)["run"] for w in LIGHT}
    assert len(set(scripts.values())) == 1, "the light workflows install alike"
    tmp = tmp_path_factory.mktemp("light")
    src = tmp / "gatekeeper-cli"  # what actions/checkout puts there: the repository
    src.mkdir()
    for name in ("gatekeeper", "requirements"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True)
    bin_dir = tmp / "venv" / "bin"
    proc = _run(
        scripts[LIGHT[0]],
        _clean_env(bin_dir, GATEKEEPER_SRC=str(src), RUNNER_TEMP=str(tmp)),
        cwd=tmp,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return bin_dir


def test_the_light_install_has_no_torch(light_bin: Path) -> None:
    python = str(light_bin / "python")
    no_torch = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True)
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr
    version = subprocess.run(
        [str(light_bin / "gatekeeper"), "--version"], capture_output=True, text=True
    )
    assert version.returncode == 0 and "gatekeeper" in version.stdout, version.stderr


def test_fork_comment_posts_the_comment(
    light_bin: Path, github_api: FakeGitHub, tmp_path: Path
) -> None:
    github_api.add_actions_token(TOKEN, write=True)
    artifact = tmp_path / "gatekeeper-comment"
    artifact.mkdir()
    (artifact / "pr-number").write_text("42\n")
    (artifact / "report.md").write_text("## gatekeeper\n\nall targets pass\n")
    # the GitHub CLI's one call (`gh api repos/$REPO/pulls/$pr --jq .head.sha`)
    stand_in = tmp_path / "gh-bin"
    stand_in.mkdir()
    (stand_in / "gh").write_text(f"#!/bin/sh\necho {HEAD_SHA}\n")
    (stand_in / "gh").chmod(0o755)
    step = _step("fork-comment.yml", "Post the comment")
    env = _clean_env(
        light_bin,
        GITHUB_TOKEN=TOKEN,
        GH_TOKEN=TOKEN,
        GITHUB_API_URL=github_api.url,
        REPO=REPO,
        HEAD_SHA=HEAD_SHA,
        DIR=str(artifact),
    )
    env["PATH"] = os.pathsep.join([str(stand_in), env["PATH"]])
    proc = _run(step["run"], env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "internal error" not in proc.stderr
    (comment,) = github_api.comments_on(REPO, 42)
    assert "all targets pass" in comment["body"]


def test_dashboard_pages_builds_the_site(light_bin: Path, tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store = open_store(str(store_dir))
    for i in range(2):
        result = make_result("net/b4/default", seed=i)
        result.measured_at = f"2025-01-0{i + 1}T00:00:00Z"
        publish_result(store, result, ref="main", commit=f"{i}" * 40)
    step = _step("dashboard-pages.yml", "Build the site")
    env = _clean_env(light_bin, GATEKEEPER_STORE=str(store_dir), RUNNER_TEMP=str(tmp_path))
    proc = _run(step["run"], env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "gatekeeper-dashboard" / "index.html").is_file()


def test_nothing_installs_into_a_self_hosted_runners_python() -> None:
    """On a self-hosted runner the next job finds whatever a job left in its Python (a
    `.pth` file runs in every later interpreter), so no step there installs into it: the
    action installs into a venv of its own in the job's temp dir (action.yml), and the
    light installs run only on GitHub-hosted runners, a fresh VM per job."""
    pip = re.compile(r"\bpip3?\b[^\n]*\binstall\b|\bpip_install\b|\bsetup\.py\s+install\b")
    # on a self-hosted runner, pip runs only as a venv's own, made in the job's temp dir
    into_venv = re.compile(r'^\s*"\$VENV/bin/python" -I -m pip install\b')
    installs, into_runner = [], []
    for path in sorted((ROOT / "workflows").glob("*.yml")):
        for name, job in yaml.safe_load(path.read_text())["jobs"].items():
            runs_on = job.get("runs-on")
            labels = {runs_on} if isinstance(runs_on, str) else set(runs_on or ())
            for step in job.get("steps", []):
                run = step.get("run", "")
                if pip.search(run):
                    installs.append((path.name, name))
                if "self-hosted" not in labels:
                    continue
                for line in run.splitlines():
                    if pip.search(line) and not into_venv.match(line):
                        into_runner.append((path.name, name, line.strip()))
                if pip.search(run):
                    venv = step.get("env", {}).get("VENV", "")
                    assert venv.startswith("${{ runner.temp }}/"), (path.name, name)
                    assert '-I -m venv "$VENV"' in run, (path.name, name)
    assert set(installs) == {
        ("fork-comment.yml", "comment"),
        ("dashboard-pages.yml", "build"),
        ("bisect.yml", "bisect"),
        ("overhead.yml", "overhead"),
    }
    assert not into_runner, into_runner
    setup = yaml.safe_load((ROOT / "action.yml").read_text())["runs"]["steps"][0]["run"]
    assert '"$py" -I -m venv "$venv"' in setup and '"$venv/bin/python" -I -m pip' in setup
    assert not re.search(r'"\$py" -I -m pip install', setup)  # never the runner's Python
