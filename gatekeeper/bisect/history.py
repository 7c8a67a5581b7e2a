"""The commits ``bisect`` walks and where it checks them out, every git call through
:mod:`gatekeeper.git`.

The range is bad's first-parent line back to good (the commits of the branch, as its
baselines were published), oldest first. Each commit measured gets a detached
``git worktree`` under ``--out``; the user's checkout, its HEAD and its working tree are
never touched, and the worktrees are removed when bisect ends, however it ends:
Ctrl-C (SIGINT) and SIGTERM unwind through the same ``finally``.
"""

from __future__ import annotations

import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..git import git, try_git
from ..scratch import scratch_dir

_FIELDS = "%H%x00%s%x00%an <%ae>%x00%aI"


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str
    author: str
    date: str  # ISO 8601, the author's

    @property
    def short(self) -> str:
        return self.sha[:12]

    def as_dict(self) -> dict:
        return {"sha": self.sha, "subject": self.subject, "author": self.author, "date": self.date}


@dataclass(frozen=True)
class Range:
    """``commits[0]`` is good, ``commits[-1]`` bad; the candidates are ``commits[1:]``."""

    good_ref: str
    bad_ref: str
    commits: list[Commit]

    @property
    def good(self) -> Commit:
        return self.commits[0]

    @property
    def bad(self) -> Commit:
        return self.commits[-1]

    @property
    def size(self) -> int:
        """How many commits may be the culprit (bad included, good not)."""
        return len(self.commits) - 1

    def as_dict(self) -> dict:
        return {
            "good": {"ref": self.good_ref, **self.good.as_dict()},
            "bad": {"ref": self.bad_ref, **self.bad.as_dict()},
            "commits": self.size,
        }


def repo_root(where: Path) -> Path:
    root = try_git(where, "rev-parse", "--show-toplevel")
    if root is None:
        raise UsageError(f"bisect needs a git checkout: {where} is not in one")
    return Path(root)


def check_clean(root: Path) -> None:
    """A modified tracked file is an error: bisect measures commits, not the working
    tree, and a user who edited one would expect it measured."""
    dirty = try_git(root, "status", "--porcelain", "--untracked-files=no")
    if dirty:
        first = dirty.splitlines()[0].split(maxsplit=1)[-1]  # " M path", stripped
        raise UsageError(
            f"the working tree has uncommitted changes ({first}"
            f"{' and more' if len(dirty.splitlines()) > 1 else ''}): commit or stash them "
            "first (bisect measures commits only, and leaves the checkout as it is)"
        )


def resolve(root: Path, ref: str, flag: str) -> str:
    sha = try_git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if sha is None:
        raise UsageError(f"{flag} {ref}: no such commit in this repository")
    return sha


def _is_ancestor(root: Path, older: str, newer: str) -> bool:
    try:
        git(root, "merge-base", "--is-ancestor", older, newer)
    except UsageError:
        return False
    return True


def commit_info(root: Path, sha: str) -> Commit:
    sha_, subject, author, date = git(root, "show", "-s", f"--format={_FIELDS}", sha).split("\0")
    return Commit(sha_, subject, author, date)


def load_range(root: Path, good_ref: str, bad_ref: str) -> Range:
    """good, then bad's first-parent line back to it; one-line errors for refs that do
    not resolve, are the same commit, are the wrong way round or are not related."""
    good, bad = resolve(root, good_ref, "--good"), resolve(root, bad_ref, "--bad")
    if good == bad:
        raise UsageError(f"--good {good_ref} and --bad {bad_ref} are the same commit {good[:12]}")
    if not _is_ancestor(root, good, bad):
        if _is_ancestor(root, bad, good):
            raise UsageError(
                f"--good {good_ref} is newer than --bad {bad_ref} (bad is its ancestor): swap them"
            )
        raise UsageError(
            f"--good {good_ref} is not an ancestor of --bad {bad_ref}: bisect needs good on "
            "bad's history"
        )
    text = git(
        root,
        "rev-list",
        "--first-parent",
        "--reverse",
        f"--format=%P%x00{_FIELDS}",
        bad,
        f"^{good}",
    )
    # rev-list --format prints "commit <sha>" before each formatted line
    rows = [line.split("\0") for line in text.splitlines() if "\0" in line]
    if not rows or rows[0][0].split()[:1] != [good]:
        raise UsageError(
            f"--good {good_ref} is on a branch merged into --bad {bad_ref}, not on its "
            "first-parent line: give the commit of --bad's branch it was merged by, or one "
            "before it"
        )
    commits = [commit_info(root, good)] + [Commit(*row[1:]) for row in rows]
    return Range(good_ref, bad_ref, commits)


def read_file(root: Path, sha: str, rel: str) -> str | None:
    """A file's text at a commit (None where the commit has none)."""
    return try_git(root, "show", f"{sha}:{rel}")


class Worktrees:
    """Detached worktrees of commits under ``folder``, one per commit, all removed by
    :meth:`close` (and the folder with them)."""

    def __init__(self, root: Path, folder: Path) -> None:
        self.root, self.folder = root, folder
        self.made: dict[str, Path] = {}

    def of(self, sha: str) -> Path:
        if sha not in self.made:
            tree = self.folder / sha[:12]
            self.folder.mkdir(parents=True, exist_ok=True)
            self.made[sha] = tree  # before adding it: an interrupt in between still cleans
            git(self.root, "worktree", "add", "--detach", str(tree), sha)
        return self.made[sha]

    def close(self) -> None:
        for tree in self.made.values():
            try_git(self.root, "worktree", "remove", "--force", str(tree))
        self.made.clear()
        shutil.rmtree(self.folder, ignore_errors=True)
        try_git(self.root, "worktree", "prune")


@contextmanager
def worktrees(root: Path, folder: Path) -> Iterator[Worktrees]:
    """:class:`Worktrees` removed at the end, also when SIGTERM or SIGINT stops bisect
    (SIGTERM is raised as KeyboardInterrupt while this runs, so ``finally`` runs)."""
    trees = Worktrees(root, folder)
    trees.close()  # what a killed bisect left in this --out

    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    # signal handlers belong to the main thread (the CLI); elsewhere only finally cleans
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, stop) if main else None
    try:
        yield trees
    finally:
        # a second signal must not cut the cleanup short
        sigs = (signal.SIGTERM, signal.SIGINT) if main else ()
        held = {s: signal.signal(s, signal.SIG_IGN) for s in sigs}
        try:
            trees.close()
        finally:
            for s, handler in held.items():
                signal.signal(s, handler)
            if main:
                signal.signal(signal.SIGTERM, previous)


@contextmanager
def file_at(root: Path, sha: str, rel: str) -> Iterator[Path | None]:
    """A file of a commit, written to a temporary folder under its own name (the config
    at bad, read without checking bad out); None where the commit has none."""
    text = read_file(root, sha, rel)
    if text is None:
        yield None
        return
    with scratch_dir("gk-bisect-") as tmp:
        path = Path(tmp, Path(rel).name)
        path.write_text(text + "\n")
        yield path
