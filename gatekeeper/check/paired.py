"""Which mode decides a run's timing, and paired mode's base version.

Paired mode (the default whenever it can be had) measures the base commit's model in the
same process as the pull request's, round by round, so drift between processes cancels.
It needs the base commit in the repository the config lives in: a branch, a tag, a sha,
or the pull request event's ``base.sha`` (the Action fetches it into a shallow checkout).
When none of them resolves, ``auto`` falls back to stored mode (the baseline's recorded
runs) and says why in one line.

The base side is the base commit as it was: its own config (:func:`base_config`, found
in its checkout by the rules that found the head's) defines each target the base builds,
and its gate rules judge the pull request (gate.governing).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..config import Config
from ..errors import ConfigError, UsageError
from ..git import git, try_git
from ..project import definition, expand, load_config
from ..results import BaseTarget
from ..scratch import scratch_dir
from ..targets import Target

log = logging.getLogger("gatekeeper.paired")

ModeName = Literal["auto", "paired", "stored"]


@dataclass(frozen=True)
class Mode:
    """How this run's timing is decided, and why."""

    name: Literal["paired", "stored"]
    reason: str
    base_ref: str = ""  # paired: the ref asked for
    base_commit: str = ""  # paired: what it resolved to


def _event_base_sha() -> str:
    """The pull request event's ``base.sha``, when this run is about one."""
    if not os.environ.get("GITHUB_EVENT_PATH"):
        return ""
    from ..github.event import pr_context_from_env

    try:
        pr = pr_context_from_env()
    except Exception:  # an unreadable event: not a reason to fail the run
        return ""
    return pr.base_sha if pr is not None else ""


def resolve_base(ref: str, config_dir: Path) -> tuple[str | None, str]:
    """(the base commit, how it was found) or (None, why not)."""
    root = try_git(config_dir, "rev-parse", "--show-toplevel")
    if root is None:
        return None, f"{config_dir} is not in a git checkout"
    event_sha = _event_base_sha()
    candidates = [(event_sha, f"{ref} (the pull request's base commit)")] if event_sha else []
    candidates += [(c, c) for c in (ref, f"origin/{ref}", f"refs/remotes/origin/{ref}")]
    for cand, how in candidates:
        commit = try_git(Path(root), "rev-parse", "--verify", "--quiet", f"{cand}^{{commit}}")
        if commit:
            return commit, how
    return None, (
        f"the base {ref!r} is not in this checkout (fetch it, e.g. "
        f"`git fetch --depth=1 origin {ref}`)"
    )


def choose_mode(requested: ModeName, base_ref: str, config_dir: Path) -> Mode:
    """``auto``: paired whenever the base commit resolves and differs from what is checked
    out; else stored, with the reason. ``paired``: the base commit must resolve."""
    if requested == "stored":
        return Mode("stored", "stored mode: asked for (--mode stored)")
    commit, how = resolve_base(base_ref, config_dir)
    if commit is None:
        if requested == "paired":
            raise UsageError(f"--mode paired: {how}")
        return Mode("stored", f"stored mode: cannot pair, {how}")
    if requested == "auto":
        root = Path(git(config_dir, "rev-parse", "--show-toplevel"))
        head = try_git(root, "rev-parse", "HEAD")
        dirty = try_git(root, "status", "--porcelain", "--untracked-files=no")
        if head == commit and not dirty:
            return Mode(
                "stored",
                f"stored mode: the checkout is the base commit "
                f"{commit[:12]} ({how}), nothing to pair with",
            )
    return Mode("paired", f"paired with {how} at {commit[:12]}", base_ref, commit)


@contextmanager
def checkout(commit: str, config_dir: Path) -> Iterator[Path]:
    """Yield the config's folder inside a detached worktree of ``commit``; the worktree is
    removed afterwards, whatever happens."""
    try:
        root = Path(git(config_dir, "rev-parse", "--show-toplevel"))
    except (UsageError, OSError):
        raise UsageError(f"paired mode needs a git checkout: {config_dir} is not in one") from None
    with scratch_dir("gk-paired-") as tmp:
        tree = Path(tmp) / "base"
        git(root, "worktree", "add", "--detach", str(tree), commit)
        try:
            yield tree / config_dir.resolve().relative_to(root.resolve())
        finally:
            try_git(root, "worktree", "remove", "--force", str(tree))


def base_config(head: Config, folder: Path) -> Config:
    """The base commit's config, from ``folder`` (the head config's folder in the base
    checkout, :func:`checkout`): the file at the head config's path when it was named
    explicitly, else found as the head's was (``gatekeeper.toml``, or
    ``[tool.gatekeeper]`` in ``pyproject.toml``). A config that is missing or does not
    load is a :class:`ConfigError` that names the file as the base commit's."""
    name = head.path.name if head.path is not None else None
    try:
        if name is None or name in ("gatekeeper.toml", "pyproject.toml"):
            return load_config(None, cwd=folder)
        return load_config(folder / name)
    except ConfigError as e:
        said = str(e).replace(f"{folder}{os.sep}", "").replace(str(folder), ".")
        raise ConfigError(f"the base commit's config does not load: {said}") from None


@dataclass(frozen=True)
class PairedBase:
    """Paired mode's base version: where it was checked out, and its own config."""

    ref: str
    commit: str
    base_dir: Path  # the config's folder inside the base worktree
    config: Config  # the base commit's config, loaded from there
    targets: dict[str, Target]  # its targets, by id

    @classmethod
    def of(cls, mode: Mode, base_dir: Path, config: Config) -> PairedBase:
        """Raises ConfigError when the base's config does not expand into targets."""
        by_id = {t.id: t for t in expand(config)}
        return cls(mode.base_ref, mode.base_commit, base_dir, config, by_id)

    def removed(self, head: Config) -> list[str]:
        """The base's targets that the head's config no longer defines."""
        return sorted(set(self.targets) - {t.id for t in expand(head)})

    def side(self, target: Target) -> tuple[Target | None, BaseTarget]:
        """The base's target of the same id (None: new in this change), and what the
        results record of it."""
        base = self.targets.get(target.id)
        if base is None:
            return None, BaseTarget(defined=False)
        rules = self.config.gate_for(base.model)
        return base, BaseTarget(defined=True, rules=rules, definition=definition(base))
