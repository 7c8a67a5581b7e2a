"""action.yml and the example workflows against GitHub's schemas and zizmor's audits.

check-jsonschema validates with the schemas it ships (SchemaStore's GitHub workflow and
action schemas; no network). zizmor runs offline with its default ("regular") persona:
any finding fails, so a template injection, an unpinned third-party action, credentials
persisted by checkout, an over-broad token or a dangerous trigger used without a stated
reason cannot land; with the auditor persona, neither can a self-hosted runner without
its reason. (The `workflow_run` triggers and the self-hosted runners carry an inline
`zizmor: ignore` with their reason.) The runner layout is checked here too: pull-request
code never runs where the signing key is (docs/security.md).
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
    "overhead.yml",
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
    """The auditor persona, zizmor's strictest: a finding is fixed or ignored inline with
    its reason (the self-hosted runners: docs/security.md)."""
    proc = _run(
        _tool("zizmor"),
        "--offline",
        "--persona",
        "auditor",
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


# -------------------------------------------------------------- who runs where, with what

# the events whose runs execute a pull request's code (its checkout, its workflow file)
PR_EVENTS = {
    "pull_request",
    "pull_request_target",
    "pull_request_review",
    "pull_request_review_comment",
    "merge_group",
}
ACTION = "your-org/gatekeeper@"


def _triggers(doc: dict) -> set[str]:
    on = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on:` as True
    return {on} if isinstance(on, str) else set(on or ())


def _labels(job: dict) -> set[str]:
    runs_on = job.get("runs-on")
    return {runs_on} if isinstance(runs_on, str) else set(runs_on or ())


def _holds_secrets(job: dict) -> bool:
    """A job that can read a secret (an environment's or the repository's) or deploys."""
    return "environment" in job or "secrets." in json.dumps(job)


def runner_violations(docs: dict[str, dict]) -> list[str]:
    """Why pull-request code could reach a runner that holds the key, if it could: every
    self-hosted job carries exactly one of `trusted`/`untrusted`; `trusted` jobs are the
    ones that hold secrets (from an environment), and never a pull request's; pull
    requests' jobs read no secret, run on `untrusted` runners, and no runner that takes a
    `trusted` job can take them (their labels are not a subset of a trusted job's)."""
    found, trusted, untrusted = [], [], []
    for name, doc in docs.items():
        pr = bool(_triggers(doc) & PR_EVENTS)
        for job_name, job in doc["jobs"].items():
            where, labels = f"{name}:{job_name}", _labels(job)
            if pr and _holds_secrets(job):
                found.append(f"{where}: a pull request's job holds a secret or an environment")
            if "self-hosted" not in labels:
                continue  # GitHub-hosted: a fresh VM per job
            kind = labels & {"trusted", "untrusted"}
            if len(kind) != 1:
                found.append(f"{where}: self-hosted without exactly one of trusted/untrusted")
            elif kind == {"trusted"} and (pr or not _holds_secrets(job)):
                found.append(f"{where}: `trusted` is for the jobs that hold the key, no others")
            elif kind == {"untrusted"} and _holds_secrets(job):
                found.append(f"{where}: holds a secret on an `untrusted` runner")
            (trusted if kind == {"trusted"} else untrusted).append((where, labels))
    for pr_where, pr_labels in untrusted:
        for key_where, key_labels in trusted:
            if pr_labels <= key_labels or key_labels <= pr_labels:
                found.append(f"{pr_where} can run on the runners of {key_where}")
    return found


def _docs() -> dict[str, dict]:
    return {p.name: yaml.safe_load(p.read_text()) for p in WORKFLOWS}


def test_pull_request_code_and_the_key_never_share_a_runner() -> None:
    docs = _docs()
    assert runner_violations(docs) == []
    key_jobs = [
        f"{n}:{j}" for n, d in docs.items() for j, job in d["jobs"].items() if _holds_secrets(job)
    ]
    assert "main-baseline.yml:baseline" in key_jobs and "deploy-warm.yml:deploy" in key_jobs


def test_the_runner_check_catches_a_shared_runner() -> None:
    """A positive control: the labels the examples had (every GPU job on `[self-hosted,
    gpu]`), and a pull request's job that a trusted runner could take, are caught."""
    docs = _docs()
    shared = json.loads(json.dumps(docs))
    for doc in shared.values():
        for job in doc["jobs"].values():
            if "self-hosted" in _labels(job):
                job["runs-on"] = ["self-hosted", "gpu"]
    assert len(runner_violations(shared)) >= 4
    subset = json.loads(json.dumps(docs))
    subset["pr-gate.yml"]["jobs"]["gate"]["runs-on"] = ["self-hosted", "gpu"]
    assert sorted(runner_violations(subset)) == [
        "pr-gate.yml:gate can run on the runners of deploy-warm.yml:deploy",
        "pr-gate.yml:gate can run on the runners of main-baseline.yml:baseline",
        "pr-gate.yml:gate: self-hosted without exactly one of trusted/untrusted",
    ]


def test_the_key_comes_only_from_an_environment() -> None:
    """The signing key is an environment's secret (an environment with a deployment-branch
    rule: main only), so no pull-request job can read it, a same-repository one included."""
    for name, doc in _docs().items():
        for job_name, job in doc["jobs"].items():
            if "secrets.GATEKEEPER_SIGNING_KEY" in json.dumps(job):
                assert job.get("environment"), f"{name}:{job_name} takes the key outside one"


def _gatekeeper_steps() -> list[tuple[str, dict]]:
    return [
        (f"{n}:{j}", step.get("with", {}))
        for n, d in _docs().items()
        for j, job in d["jobs"].items()
        for step in job.get("steps", [])
        if step.get("uses", "").startswith(ACTION)
    ]


def test_every_job_with_the_key_requires_signatures() -> None:
    """A job given the key loads only bundles signed with it: with the secret missing, a
    compile would take unsigned bundles as hits and seeds, and publish them again."""
    steps = _gatekeeper_steps()
    with_key = [(w, s) for w, s in steps if "signing-key" in s]
    assert {w for w, _ in with_key} == {"main-baseline.yml:baseline", "deploy-warm.yml:deploy"}
    for where, inputs in with_key:
        assert inputs.get("require-signature") is True, f"{where} does not require signatures"
    for where, inputs in steps:  # a job that writes the store is one of them
        if inputs.get("read-only") is False:
            assert "signing-key" in inputs, where
