"""git, as the parent runs it (paired mode's base checkout, provenance, bisect): one
helper, so every call has the same timeout, no stdin, the same one-line error, and the
same defences against what a worker may have left behind.

Model code ran in the checkout before most of these calls. Its box keeps ``.git`` and
every ``PATH`` folder read-only (:mod:`gatekeeper.boundary.confine`); besides, git is
found once, before the first worker starts (:func:`resolve`, called by
:func:`gatekeeper.secrecy.seal`), and always run by that absolute path, with the system
and global config off, no hooks, no fsmonitor, no pager, no external diff, no ssh
command and no credential helper, and without the parent's secrets in its environment.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .errors import UsageError

# config that would make git run a program of the repository's choosing
SAFE_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.pager=cat",
    "core.sshCommand=false",
    "core.askPass=",
    "credential.helper=",
    "diff.external=",
    "protocol.ext.allow=never",
    "log.showSignature=false",
)
# per-driver keys that name a program (filter drivers run on checkout and status)
_DRIVER_KEYS = r"^(filter|diff|merge)\..*\.(clean|smudge|process|command|textconv|driver)$"
_program: str | None = None


def resolve() -> str | None:
    """The absolute path of the git this process runs, found on ``PATH`` the first time
    and never again (a worker may later plant another ``git`` on ``PATH``)."""
    global _program
    if _program is None:
        found = shutil.which("git")
        _program = str(Path(found).resolve()) if found else ""
    return _program or None


def environ() -> dict[str, str]:
    """git's environment: the parent's less its secrets and git's own steering variables,
    system and global config off."""
    from .secrecy import is_secret

    env = {k: v for k, v in os.environ.items() if not is_secret(k) and not k.startswith("GIT_")}
    env |= {
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_PAGER": "cat",
        "GIT_OPTIONAL_LOCKS": "0",
    }
    return env


def git(cwd: Path | None, *args: str, timeout: float = 120) -> str:
    """``git [-C cwd] args``' stripped output; a failure is a one-line UsageError naming
    the command and git's last line."""
    program = resolve()
    if program is None:
        raise UsageError(f"git {' '.join(args[:2])}: git is not installed")
    where = ["-C", str(cwd)] if cwd is not None else []
    safe = [arg for pair in SAFE_CONFIG for arg in ("-c", pair)]
    if args[:1] != ("config",):
        safe += _no_drivers(program, where, safe)
    return _run(program, [*safe, *where, *args], args, timeout)


def _no_drivers(program: str, where: list[str], safe: list[str]) -> list[str]:
    """``-c`` pairs that empty every filter, diff and merge driver the repository's
    config names (git runs none then)."""
    try:
        named = _run(
            program,
            [*safe, *where, "config", "--name-only", "--get-regexp", _DRIVER_KEYS],
            ("config",),
            30,
        )
    except UsageError:  # none, or no repository
        return []
    pairs = [arg for key in named.split() for arg in ("-c", f"{key}=")]
    drivers = {key.split(".")[1] for key in named.split() if key.startswith("filter.")}
    return pairs + [arg for d in sorted(drivers) for arg in ("-c", f"filter.{d}.required=false")]


def _run(program: str, argv: list[str], args: tuple[str, ...], timeout: float) -> str:
    try:
        proc = subprocess.run(
            [program, "--no-pager", *argv],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            env=environ(),
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
