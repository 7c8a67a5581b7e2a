"""action.yml and the example workflows against GitHub's schemas and zizmor's audits.

check-jsonschema validates with the schemas it ships (SchemaStore's GitHub workflow and
action schemas; no network). zizmor runs offline with its default ("regular") persona:
any finding fails, so a template injection, an unpinned third-party action, credentials
persisted by checkout, an over-broad token or a dangerous trigger used without a stated
reason cannot land. (The one `workflow_run` trigger, the fork-comment pattern, carries an
inline `zizmor: ignore` with its reason.)
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / "workflows").glob("*.yml"))
EXPECTED = {
    "pr-gate.yml",
    "main-baseline.yml",
    "deploy-warm.yml",
    "fork-comment.yml",
    "matrix-gate.yml",
    "dashboard-pages.yml",
    "bisect.yml",
}
# what a workflow may write beyond the PR comment: deploying Pages needs these two, and
# bisect's comment job the issue it posts on
MAY_WRITE = {"dashboard-pages.yml": {"pages", "id-token"}, "bisect.yml": {"issues"}}


def _tool(name: str) -> str:
    """The tool beside this interpreter (the project's venv), else on PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.is_file() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install check-jsonschema zizmor")
    return found


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        args,
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_every_example_workflow_is_there() -> None:
    assert {p.name for p in WORKFLOWS} == EXPECTED


def test_workflows_match_the_github_workflow_schema() -> None:
    proc = _run(
        _tool("check-jsonschema"),
        "--builtin-schema",
        "vendor.github-workflows",
        *map(str, WORKFLOWS),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_action_matches_the_github_action_schema() -> None:
    proc = _run(
        _tool("check-jsonschema"),
        "--builtin-schema",
        "vendor.github-actions",
        str(ROOT / "action.yml"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_zizmor_finds_nothing() -> None:
    proc = _run(
        _tool("zizmor"),
        "--offline",
        "--strict-collection",
        "--format",
        "json",
        "--no-progress",
        str(ROOT / "action.yml"),
        *map(str, WORKFLOWS),
    )
    findings = json.loads(proc.stdout or "[]")
    assert findings == [], json.dumps(findings, indent=2)[:5000]
    assert proc.returncode == 0, proc.stderr


def test_third_party_actions_are_pinned_by_full_sha() -> None:
    """zizmor's policy lets `actions/*` float on a tag; ours does not."""
    uses = [
        step["uses"]
        for path in WORKFLOWS
        for job in yaml.safe_load(path.read_text())["jobs"].values()
        for step in job.get("steps", [])
        if "uses" in step
    ]
    assert uses
    for ref in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}", ref), ref


def test_no_workflow_grants_more_than_it_needs() -> None:
    """Every workflow starts from no permissions; each job asks for its own."""
    for path in WORKFLOWS:
        doc = yaml.safe_load(path.read_text())
        assert doc.get("permissions") == {}, f"{path.name}: top-level permissions must be {{}}"
        for name, job in doc["jobs"].items():
            perms = job.get("permissions")
            assert isinstance(perms, dict), f"{path.name}:{name} names no permissions"
            assert set(perms.values()) <= {"read", "write"}
            writes = {k for k, v in perms.items() if v == "write"}
            allowed = {"pull-requests"} | MAY_WRITE.get(path.name, set())
            assert writes <= allowed, f"{path.name}:{name} writes {writes}"


def test_zizmor_does_audit(tmp_path: Path) -> None:
    """A positive control: the same zizmor call flags an injectable `run:`."""
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "name: bad\non: pull_request\npermissions: {}\njobs:\n  a:\n    runs-on: ubuntu-latest\n"
        "    permissions: {}\n    steps:\n"
        '      - run: echo "${{ github.event.pull_request.title }}"\n'
    )
    proc = _run(_tool("zizmor"), "--offline", "--format", "json", "--no-progress", str(bad))
    assert "template-injection" in {f["ident"] for f in json.loads(proc.stdout)}
    assert proc.returncode != 0
