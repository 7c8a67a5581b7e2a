"""The GitHub Actions layer: step outputs, the job summary, workflow commands; no-ops outside."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gatekeeper.github import actions


def _read_file_commands(path: Path) -> dict[str, str]:
    """Parse ``name<<DELIM`` heredoc records the way the runner does."""
    lines = path.read_text(encoding="utf-8").split(os.linesep)
    values: dict[str, str] = {}
    while lines and lines[0]:
        name, delimiter = lines.pop(0).split("<<", 1)
        end = lines.index(delimiter)
        values[name] = "\n".join(lines[:end])
        lines = lines[end + 1 :]
    return values


@pytest.fixture
def actions_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "output"))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    return tmp_path


def test_set_output_writes_multiline_records(actions_env: Path) -> None:
    report = "## Report\n\n| a | b |\n|---|---|\nEOF\n"

    assert actions.in_actions()
    assert actions.set_output("verdict", "pass")
    assert actions.set_output("report", report)
    assert actions.set_output("cache-hit", True)

    assert _read_file_commands(actions_env / "output") == {
        "verdict": "pass",
        "report": report,
        "cache-hit": "true",
    }


def test_append_summary_appends_markdown(actions_env: Path) -> None:
    assert actions.append_summary("# one")
    assert actions.append_summary("two")

    assert (actions_env / "summary.md").read_text(encoding="utf-8") == "# one\ntwo\n"


def test_workflow_commands_in_actions(
    actions_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert actions.error_annotation(
        "3 regressions,\nsee summary", file="gate.toml", line=3, title="gate"
    )
    with actions.group("compile"):
        print("inside")

    assert capsys.readouterr().out.splitlines() == [
        "::error title=gate,file=gate.toml,line=3::3 regressions,%0Asee summary",
        "::group ::compile",
        "inside",
        "::endgroup::",
    ]


def test_outside_actions_everything_is_a_no_op(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert not actions.in_actions()
    assert not actions.set_output("verdict", "pass")
    assert not actions.append_summary("# report")
    assert not actions.error_annotation("boom")
    with actions.group("compile"):
        pass

    assert capsys.readouterr().out == ""
    assert list(tmp_path.iterdir()) == []
