"""Paired mode's base version: a detached git worktree of BASE_REF beside this checkout."""
from __future__ import annotations

import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import UsageError


def _git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["git failed"])[-1]
        raise UsageError(f"git {' '.join(args[:2])}: {last}")
    return proc.stdout.strip()


@contextmanager
def checkout(ref: str, config_dir: Path) -> Iterator[tuple[Path, str]]:
    """Yield (the config's folder inside a worktree of ``ref``, the commit it resolves to).

    The worktree is removed afterwards, whatever happens.
    """
    try:
        root = Path(_git(config_dir, "rev-parse", "--show-toplevel"))
    except (UsageError, OSError):
        raise UsageError(f"--paired needs a git checkout: {config_dir} is not in one") from None
    commit = _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    with tempfile.TemporaryDirectory(prefix="gk-paired-") as tmp:
        tree = Path(tmp) / "base"
        _git(root, "worktree", "add", "--detach", str(tree), commit)
        try:
            yield tree / config_dir.resolve().relative_to(root.resolve()), commit
        finally:
            subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)],
                           capture_output=True, stdin=subprocess.DEVNULL, timeout=120)
