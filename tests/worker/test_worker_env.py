"""The worker runs the user's model code, and everything it imports, in an allow-list
of the parent's environment (plus the config's pass_env), never a credential: a
factory run by ``gatekeeper key`` (a real worker, building the model, nothing
compiled) records the variables it can see."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from support.helpers import TINY_CONFIG, TINY_MODEL, gk, write_project
from support.outbox import Outbox

SPY_MODEL = TINY_MODEL.replace(
    "def make():\n",
    textwrap.dedent("""
        def make():
            import json, os, pathlib
            # the box leaves nothing to write that outlives it: a FIFO the test reads
            outbox = (pathlib.Path(__file__).parent / "outbox.txt").read_text()
            with open(outbox, "w") as f:
                f.write(json.dumps(dict(os.environ)) + "\\n")
    """).lstrip("\n"),
)
assert "outbox.txt" in SPY_MODEL

SECRETS = {
    "GATEKEEPER_SIGNING_KEY": "sk-signing",
    "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "AWS_SESSION_TOKEN": "aws-session",
    "AWS_PROFILE": "store-writer",
    "GITHUB_TOKEN": "ghs_token",
    "GH_TOKEN": "ghs_token2",
    "GITHUB_ENV": "/tmp/steers-later-steps",
    "ACTIONS_RUNTIME_TOKEN": "runtime",
    "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "oidc",
    "ACTIONS_ID_TOKEN_REQUEST_URL": "https://oidc.example",
    "GOOGLE_APPLICATION_CREDENTIALS": "/secrets/gcp.json",
    "AZURE_CLIENT_SECRET": "azure",
    "HF_TOKEN": "hf_x",
    "WANDB_API_KEY": "wandb",
    "MY_SERVICE_PASSWORD": "hunter2",
    "GIT_CONFIG_VALUE_0": "AUTHORIZATION: basic eA==",
    # credentials no word in their names gives away: only an allow-list keeps them out
    "PGPASSWORD": "pg-secret",
    "MYSQL_PWD": "mysql-secret",
    "DATABASE_URL": "postgres://u:db-secret@h/d",
    "SSH_KEY": "ssh-secret",
    "DEPLOY_KEY": "deploy-secret",
    "RUNNER_TEMP": "/tmp/runner-temp-with-file-commands",
}
# not on the allow-list: passed only when the config's pass_env names them
PASSED = {"MY_MODEL_SETTING": "42", "KEYBOARD_LAYOUT": "us"}
KEPT = {
    "OMP_NUM_THREADS": "1",
    "TORCHINDUCTOR_MAX_AUTOTUNE": "0",
    "HF_HOME": "/tmp/hf-home",
}


@pytest.mark.e2e  # a worker or a fresh interpreter importing torch
def test_a_factory_cannot_see_the_secrets(tmp_path: Path) -> None:
    config = TINY_CONFIG.replace('store = "store"', 'store = "store"\npass_env = ["MY_*"]')
    project = write_project(tmp_path / "p", SPY_MODEL, config)
    outbox = Outbox()
    (project / "outbox.txt").write_text(str(outbox.path))
    proc = gk("key", "--json", cwd=project, env={**SECRETS, **KEPT, **PASSED})
    assert proc.returncode == 0, proc.stderr
    (seen,) = outbox.docs()
    assert not set(SECRETS) & set(seen)
    assert not any(v in json.dumps(seen) for v in SECRETS.values())
    for name, value in {**KEPT, "MY_MODEL_SETTING": "42"}.items():
        assert seen.get(name) == value, name
    assert "KEYBOARD_LAYOUT" not in seen  # neither allowed nor passed
    assert seen["TORCHINDUCTOR_CACHE_DIR"]  # what the worker does need is there


def test_the_scrubbed_environment_is_the_one_every_worker_gets(tmp_path: Path, monkeypatch) -> None:
    from gatekeeper.boundary.client import cache_env
    from gatekeeper.secrecy import is_secret

    for name, value in {**SECRETS, **KEPT, **PASSED}.items():
        monkeypatch.setenv(name, value)
    env = cache_env(tmp_path, {"TORCH_CACHING_PRECOMPILE": "1"}, ["KEYBOARD_*", "PG*", "GITHUB*"])
    assert not set(SECRETS) & set(env)  # pass_env never passes a credential nor GITHUB_*
    assert {k: env[k] for k in KEPT} == KEPT
    assert env["KEYBOARD_LAYOUT"] == "us" and "MY_MODEL_SETTING" not in env
    assert env["TORCH_CACHING_PRECOMPILE"] == "1"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path)
    assert not any(
        is_secret(k) for k in ("PATH", "HOME", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES")
    )


def test_a_credential_reaches_a_worker_only_when_the_workflow_lets_it(
    tmp_path: Path, monkeypatch
) -> None:
    """Before: a name a config's ``pass_env`` listed reached the worker whatever it
    held (``PGPASSWORD``, ``DATABASE_URL``, ``DEPLOY_KEY``, ``SSH_KEY``, ``MYSQL_PWD``).
    Now none does unless the workflow lets it through (``GATEKEEPER_PASS_SECRETS``),
    and a value holding a password under a name that does not say so is dropped."""
    from gatekeeper.boundary.client import cache_env

    five = ("PGPASSWORD", "DATABASE_URL", "DEPLOY_KEY", "SSH_KEY", "MYSQL_PWD")
    for name in five:
        monkeypatch.setenv(name, SECRETS[name])
    monkeypatch.setenv("MY_DB", "postgres://u:db-secret@h/d")
    monkeypatch.setenv("MY_DB_DSN_TEXT", "host=h password=pw dbname=d")
    monkeypatch.setenv("MY_ENDPOINT", "https://models.example/v1")
    monkeypatch.delenv("GATEKEEPER_PASS_SECRETS", raising=False)
    env = cache_env(tmp_path, None, [*five, "MY_*"])
    assert not set(five) & set(env), env
    assert "MY_DB" not in env and "MY_DB_DSN_TEXT" not in env
    assert env["MY_ENDPOINT"] == "https://models.example/v1"  # no password in it
    monkeypatch.setenv("GATEKEEPER_PASS_SECRETS", "PGPASSWORD DATABASE_URL")
    env = cache_env(tmp_path, None, list(five))
    assert {n for n in five if n in env} == {"PGPASSWORD", "DATABASE_URL"}
    assert env["DATABASE_URL"] == SECRETS["DATABASE_URL"]
