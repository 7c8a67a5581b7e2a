"""git, as the parent runs it (paired mode's base checkout, provenance): one helper, so
every call has the same timeout, no stdin, and the same one-line error."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .errors import UsageError


def git(cwd: Path | None, *args: str, timeout: float = 120) -> str:
    """``git [-C cwd] args``' stripped output; a failure is a one-line UsageError naming
    the command and git's last line."""
    where = ["-C", str(cwd)] if cwd is not None else []
    try:
        proc = subprocess.run(
            ["git", *where, *args],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UsageError(f"git {' '.join(args[:2])}: {e}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["git failed"])[-1]
        raise UsageError(f"git {' '.join(args[:2])}: {last}")
    return proc.stdout.strip()


def try_git(cwd: Path | None, *args: str, timeout: float = 120) -> str | None:
    """Like :func:`git`, None where git fails, is missing, or prints nothing."""
    try:
        return git(cwd, *args, timeout=timeout) or None
    except UsageError:
        return None
