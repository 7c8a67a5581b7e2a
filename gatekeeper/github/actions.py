"""Running inside GitHub Actions: outputs, the job summary, annotations, log groups, masks.

A thin layer over github-action-utils. Every call is safe outside Actions: outputs and
the summary are written only when the runner names their file (``GITHUB_OUTPUT``,
``GITHUB_STEP_SUMMARY``), workflow commands are printed only when ``GITHUB_ACTIONS`` is
``true``; otherwise they do nothing and return False.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import github_action_utils as gha


def in_actions() -> bool:
    """Whether this process runs as a GitHub Actions step."""
    return gha.is_github_action()


def set_output(name: str, value: str | int | float | bool) -> bool:
    """Set step output ``name`` (multi-line safe: heredoc with a random delimiter)."""
    if not os.environ.get("GITHUB_OUTPUT"):
        return False
    gha.set_output(name, str(value).lower() if isinstance(value, bool) else value)
    return True


def append_summary(markdown: str) -> bool:
    """Append Markdown to the job's step summary."""
    if not os.environ.get("GITHUB_STEP_SUMMARY"):
        return False
    gha.append_job_summary(markdown)
    return True


def error_annotation(
    message: str, file: str | None = None, line: int | None = None, title: str | None = None
) -> bool:
    """An error annotation on the run (and on ``file``:``line`` when given)."""
    if not in_actions():
        return False
    gha.error(message, title=title, file=file, line=line)
    return True


@contextlib.contextmanager
def group(title: str) -> Iterator[None]:
    """A collapsible group in the Actions log; closed even when the body raises."""
    if not in_actions():
        yield
        return
    with gha.group(title):
        yield
