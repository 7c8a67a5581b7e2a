"""Mode selection: --mode auto pairs with the base commit whenever it is in the checkout
(a branch, origin/<branch>, or the pull request event's base.sha, fetched into a shallow
clone) and falls back to stored mode only when it cannot, saying why."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gatekeeper.check.paired import choose_mode
from gatekeeper.errors import UsageError


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        [
            "git",
            "-C",
            str(root),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "protocol.file.allow=always",
            *args,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    """main with one commit, and a feature branch one commit ahead."""
    root = tmp_path / "origin"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "model.py").write_text("v = 1\n")
    git(root, "add", ".")
    git(root, "commit", "-qm", "base")
    git(root, "checkout", "-qb", "feature")
    (root / "model.py").write_text("v = 2\n")
    git(root, "commit", "-qam", "pr")
    git(root, "checkout", "-q", "main")
    return root


@pytest.fixture(autouse=True)
def no_event(monkeypatch):
    monkeypatch.delenv("GITHUB_EVENT_PATH", raising=False)
    monkeypatch.delenv("GITHUB_EVENT_NAME", raising=False)


def test_outside_git_auto_is_stored_and_paired_is_an_error(tmp_path: Path):
    mode = choose_mode("auto", "main", tmp_path)
    assert mode.name == "stored" and "not in a git checkout" in mode.reason
    with pytest.raises(UsageError, match="not in a git checkout"):
        choose_mode("paired", "main", tmp_path)


def test_stored_when_asked(origin: Path):
    assert choose_mode("stored", "main", origin).name == "stored"


def test_a_branch_ahead_of_main_pairs_with_main(origin: Path):
    git(origin, "checkout", "-q", "feature")
    mode = choose_mode("auto", "main", origin)
    assert mode.name == "paired" and mode.base_commit == git(origin, "rev-parse", "main")
    assert mode.reason.startswith("paired with main at ")


def test_the_base_commit_itself_has_nothing_to_pair_with(origin: Path):
    mode = choose_mode("auto", "main", origin)
    assert mode.name == "stored" and "is the base commit" in mode.reason
    (origin / "model.py").write_text("v = 3\n")  # uncommitted work: pair with main
    assert choose_mode("auto", "main", origin).name == "paired"


def test_a_depth_1_checkout_pairs_once_the_event_base_is_fetched(
    origin: Path, tmp_path: Path, monkeypatch
):
    """What actions/checkout does for a pull request (depth 1, the PR's commit only), and
    what the Action then does: fetch the event's base.sha."""
    clone = tmp_path / "clone"
    git(
        tmp_path,
        "clone",
        "-q",
        "--depth=1",
        "--branch",
        "feature",
        "--single-branch",
        f"file://{origin}",
        str(clone),
    )
    mode = choose_mode("auto", "main", clone)
    assert mode.name == "stored" and "git fetch --depth=1 origin main" in mode.reason
    with pytest.raises(UsageError):
        choose_mode("paired", "main", clone)
    base_sha = git(origin, "rev-parse", "main")
    event = tmp_path / "event.json"
    event.write_text(
        json.dumps(
            {
                "pull_request": {
                    "number": 7,
                    "base": {"ref": "main", "sha": base_sha, "repo": {"full_name": "o/r"}},
                    "head": {"sha": git(clone, "rev-parse", "HEAD"), "repo": {"full_name": "o/r"}},
                }
            }
        )
    )
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request")
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))
    assert choose_mode("auto", "main", clone).name == "stored"  # not fetched yet
    git(clone, "fetch", "-q", "--depth=1", "origin", base_sha)
    mode = choose_mode("auto", "main", clone)
    assert mode.name == "paired" and mode.base_commit == base_sha


def test_origin_branch_is_found_when_there_is_no_local_one(origin: Path, tmp_path: Path):
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", "--branch", "feature", f"file://{origin}", str(clone))
    assert "main" not in git(clone, "branch")
    mode = choose_mode("auto", "main", clone)
    assert mode.name == "paired" and mode.base_commit == git(origin, "rev-parse", "main")


# -- the base commit's own config (gatekeeper.check.paired.base_config) -------------------------

CONFIG = """
[[models]]
name = "{name}"
factory = "m:make"
inputs = [{{ shape = [1, 4] }}]
"""


def _head(folder: Path, name: str = "gatekeeper.toml"):
    from gatekeeper.project import load_config

    (folder / name).write_text(CONFIG.format(name="head"))
    return load_config(folder / name)


def test_the_base_config_is_found_as_the_heads_was(tmp_path: Path):
    from gatekeeper.check.paired import base_config

    head, base = tmp_path / "head", tmp_path / "base"
    head.mkdir(), base.mkdir()
    # discovered: the base's pyproject section is found though the head has gatekeeper.toml
    (base / "pyproject.toml").write_text(
        "[tool.gatekeeper]\n"
        + CONFIG.format(name="base").replace("[[models]]", "[[tool.gatekeeper.models]]")
    )
    assert [m.name for m in base_config(_head(head), base).models] == ["base"]
    # named explicitly: the file at the same path, whatever else is there
    (base / "ci.toml").write_text(CONFIG.format(name="named"))
    assert [m.name for m in base_config(_head(head, "ci.toml"), base).models] == ["named"]


def test_a_base_config_that_does_not_load_is_one_line_naming_the_base(tmp_path: Path):
    from gatekeeper.check.paired import base_config
    from gatekeeper.errors import ConfigError

    head, base = tmp_path / "head", tmp_path / "gk-paired-x" / "base"
    head.mkdir(), base.mkdir(parents=True)
    with pytest.raises(ConfigError) as missing:
        base_config(_head(head), base)
    assert str(missing.value).startswith("the base commit's config does not load: no config")
    (base / "gatekeeper.toml").write_text(CONFIG.format(name="b").replace("factory", "factroy"))
    with pytest.raises(ConfigError) as bad:
        base_config(_head(head), base)
    said = str(bad.value)
    assert said.startswith("the base commit's config does not load: gatekeeper.toml: models")
    assert "gk-paired" not in said and "\n" not in said
