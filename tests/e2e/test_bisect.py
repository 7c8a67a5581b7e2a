"""``gatekeeper bisect`` on real compiles: a scratch repository of ten commits with a
slowdown planted at c3 (same outputs), a numerics change at c8, and c6, between them,
whose model does not parse (c7 repairs it)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import gk
from support.projects import QUIET, TARGET, bisect_history, git

from gatekeeper.bisect.search import bound

SLOWER, BROKEN, NUMERICS, COMMITS = 3, 6, 8, 9


def state(root: Path) -> dict:
    """What bisect must leave as it was: HEAD, the branch, the working tree, worktrees."""
    return {
        "head": git(root, "rev-parse", "HEAD"),
        "branch": git(root, "branch", "--show-current"),
        "status": git(root, "status", "--porcelain", "--ignored"),
        "worktrees": git(root, "worktree", "list", "--porcelain"),
    }


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("bisect") / "repo"
    shas = bisect_history(root, COMMITS, slower=SLOWER, numerics=NUMERICS, broken=BROKEN)
    return root, shas


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def bisect(
    root: Path, out: Path, *args: str, good: str = "HEAD~9", bad: str = "HEAD"
) -> tuple[int, dict, str]:
    before = state(root)
    # the real store (the config's, or --store's) is only read: bisect compiles elsewhere
    real = Path(args[args.index("--store") + 1]) if "--store" in args else root / "store"
    stored = tree(real) if real.is_dir() else {}
    proc = gk(
        "bisect", "--good", good, "--bad", bad, "--out", str(out), "--json", *args,
        cwd=root, env=QUIET,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    assert state(root) == before  # the checkout, HEAD and working tree untouched
    assert not (out / "worktrees").exists()
    assert (tree(real) if real.is_dir() else {}) == stored
    return proc.returncode, json.loads(proc.stdout), proc.stderr


@pytest.fixture(scope="module")
def parity(repo, tmp_path_factory) -> tuple[int, dict, str, Path]:
    """The parity bisect, once: its bundles (compiled into its --out) serve the other
    tests of this module, which copy them into theirs."""
    out = tmp_path_factory.mktemp("parity") / "out"
    return (*bisect(repo[0], out, "--metric", "parity"), out)


def bundles_of(parity, out: Path) -> Path:
    """``out`` holding the bundles the parity bisect compiled (a warm start)."""
    shutil.copytree(parity[3] / "store", out / "store")
    shutil.copy(parity[3] / ".gatekeeper-bisect", out)  # an earlier bisect's output
    return out


def test_parity_names_the_numerics_commit_and_skips_the_broken_one(repo, parity):
    root, shas = repo
    code, doc, err, out = parity
    assert code == 0, err
    (t,) = doc["targets"]
    assert t["status"] == "found" and t["culprit"]["sha"] == shas[NUMERICS]
    assert t["culprit"]["subject"] == "c8 numerics" and t["culprit"]["parent"] == shas[7]
    assert [s["sha"] for s in t["skipped"]] == [shas[BROKEN]]
    assert "SyntaxError" in t["skipped"][0]["why"]
    tested = [m["sha"] for m in t["tested"]]
    assert tested[0] == shas[-1] and len(tested) <= bound(COMMITS) == t["range"]["bound"]
    assert {m["outcome"] for m in t["tested"]} == {"good", "bad"}
    assert t["effect"]["confirmed"] and "parity" in t["effect"]["text"]
    assert t["reproduce"] == (
        f"git checkout {shas[NUMERICS]} && gatekeeper run --base-ref {shas[7]} --target {TARGET}"
    )
    report = (out / "report.md").read_text()
    assert "**Culprit: `" + shas[NUMERICS][:12] + "` c8 numerics**" in report
    assert "c6 broken" in report and "Skipped" in report
    # the culprit against its parent: the gate's own report of it, beside its results
    culprit_report = Path(t["culprit_report"])
    assert culprit_report.is_file() and "parity-failed" in culprit_report.read_text()
    assert json.loads((out / "report.json").read_text()) == doc


def test_stored_baselines_narrow_the_range_to_the_commits_in_doubt(repo, parity, tmp_path: Path):
    """main's baselines of c0..c9 (published here by hand, with the reference outputs'
    hash each commit's compile gives): only bad and the two commits around the step are
    measured, the broken c6 never is."""
    from support.factories import make_baseline, make_result

    from gatekeeper.results import ReferenceOutputs
    from gatekeeper.store import baselines, open_store

    root, shas = repo
    measured = json.loads(Path(parity[1]["targets"][0]["tested"][0]["results"]).read_text())
    env_key = measured["targets"][0]["env_key"]  # this machine's, as bisect computes it
    store = open_store(str(tmp_path / "store"))
    for i, sha in enumerate(shas):
        result = make_result(TARGET)
        result.reference = ReferenceOutputs(file="r.pt", sha256="ab"[i >= NUMERICS] * 64, size=1)
        doc = make_baseline(result).model_copy(
            update={"commit": sha, "env_key": env_key, "created_at": f"2025-01-01T00:00:0{i}Z"}
        )
        baselines.publish(store, baselines.BaselineKey(TARGET, env_key, "main"), doc)
    out = bundles_of(parity, tmp_path / "out")
    code, doc, err = bisect(root, out, "--metric", "parity", "--store", str(tmp_path / "store"))
    assert code == 0, err
    (t,) = doc["targets"]
    assert t["culprit"]["sha"] == shas[NUMERICS] and t["skipped"] == []
    assert [m["sha"] for m in t["tested"]] == [shas[-1], shas[NUMERICS], shas[7]]
    assert len(t["range"]["stored_baselines"]) == 10
    assert t["range"]["hints"][shas[7]] == "good" and t["range"]["hints"][shas[8]] == "bad"


def test_no_change_between_good_and_bad_is_exit_1_with_the_figures(repo, parity, tmp_path):
    """c5 has c0's outputs: nothing to bisect, and no culprit made up."""
    root, shas = repo
    out = bundles_of(parity, tmp_path / "out")
    code, doc, err = bisect(root, out, "--metric", "parity", bad="HEAD~4")
    assert code == 1, err
    (t,) = doc["targets"]
    assert t["status"] == "not-reproducible" and t["culprit"] is None and t["effect"] is None
    assert [m["sha"] for m in t["tested"]] == [shas[5]]
    assert t["tested"][0]["figure"]["text"].startswith("parity: outputs match")
    assert "**Not reproducible**" in (out / "report.md").read_text()


@pytest.mark.serial  # a latency verdict: run alone
def test_latency_names_the_slowdown(repo, tmp_path: Path):
    root, shas = repo
    code, doc, err = bisect(root, tmp_path / "out", "--metric", "latency", "--min-effect", "20")
    assert code == 0, err
    (t,) = doc["targets"]
    assert t["culprit"]["sha"] == shas[SLOWER], json.dumps(t["tested"], indent=1)
    assert len(t["tested"]) <= bound(COMMITS)
    effect = t["effect"]
    assert effect["confirmed"] and effect["delta"] > 0.2 and effect["ci_lo"] > 0.2
    assert effect["p_value"] < 0.05 and effect["vs_good"]["delta"] > 0.2
    assert "Where the time went" in Path(t["culprit_report"]).read_text()


BAD_INPUT = [
    (["--good", "nope", "--bad", "HEAD"], "--good nope: no such commit"),
    (["--good", "HEAD", "--bad", "HEAD~3"], "is newer than --bad"),
    (["--good", "HEAD", "--bad", "HEAD"], "the same commit"),
    (["--good", "side", "--bad", "HEAD"], "not an ancestor"),
    (["--good", "HEAD~9", "--bad", "HEAD", "--target", "nothing/*"], "no target matches"),
    (["--good", "HEAD~9", "--bad", "HEAD", "--metric", "parity", "--min-effect", "5"], "any"),
    (["--good", "HEAD~9", "--bad", "HEAD", "--min-effect", "150"], "below 100"),
]


@pytest.mark.parametrize(("args", "says"), BAD_INPUT)
def test_bad_input_is_one_line_and_leaves_nothing(repo, tmp_path: Path, args, says):
    root, _ = repo
    if "side" in args:  # a commit of its own, unrelated to the history
        git(root, "branch", "-f", "side", git(root, "commit-tree", "-m", "x", "HEAD^{tree}"))
    before = state(root)
    proc = gk("bisect", *args, "--out", str(tmp_path / "out"), cwd=root)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and says in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists() and state(root) == before


def test_a_dirty_working_tree_is_refused(tmp_path: Path):
    root = tmp_path / "repo"
    bisect_history(root, 2)
    (root / "NOTES").write_text("edited\n")
    proc = gk("bisect", "--good", "HEAD~2", "--bad", "HEAD", "--out", str(tmp_path / "o"), cwd=root)
    assert proc.returncode == 2 and "uncommitted changes (NOTES)" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


def test_an_out_folder_bisect_does_not_own_is_refused_and_left_as_it_was(repo, tmp_path: Path):
    """``--out .`` in a checkout (or any folder of the user's): bisect used to delete its
    worktrees/ folder and compile into a store it held; now one line, exit 2, nothing
    read, written or removed."""
    root, _ = repo
    mine = tmp_path / "mine"
    (mine / "worktrees").mkdir(parents=True)
    (mine / "worktrees" / "notes.txt").write_text("the user's notes\n")
    (mine / "store").mkdir()
    (mine / "store" / "kept.json").write_text("{}")
    before = tree(mine)
    for out, says in ((mine, "not empty"), (root, "not empty")):  # --out . in the checkout
        proc = gk("bisect", "--good", "HEAD~9", "--bad", "HEAD", "--out", str(out), cwd=root)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.splitlines()) == 1 and says in proc.stderr, proc.stderr
    assert tree(mine) == before
    # a store inside an --out that bisect would own is refused too
    proc = gk(
        "bisect", "--good", "HEAD~9", "--bad", "HEAD", "--out", str(tmp_path / "o"),
        "--store", str(tmp_path / "o" / "store"), cwd=root,
    )  # fmt: skip
    assert proc.returncode == 2 and "holds the store" in proc.stderr, proc.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("sig", "when"),
    [
        (signal.SIGINT, "to measure"),  # the good commit is checked out and built
        (signal.SIGTERM, "measuring paired"),  # a worker runs; check's base worktree is out
    ],
)
def test_an_interrupted_bisect_removes_its_worktrees(repo, parity, tmp_path: Path, sig, when):
    """Ctrl-C, or a CI job cancelled: the worktrees go, the checkout is as it was."""
    root, _ = repo
    before = state(root)
    out = bundles_of(parity, tmp_path / "out")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gatekeeper", "bisect", "--good", "HEAD~9", "--bad", "HEAD"]
        + ["--out", str(out)],
        cwd=root,
        env={**os.environ, **QUIET},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # as a terminal starts it: a suite started in the background by a script (bash's
        # `cmd &`) hands every child SIGINT ignored, and bisect then ran to its end
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stderr is not None
    said = [""]
    while when not in said[-1]:
        said.append(proc.stderr.readline())
        assert said[-1], "".join(said)  # it ended before getting there
        assert proc.poll() is None, proc.stderr.read()
    assert any((out / "worktrees").glob("*/tinymodel.py"))  # there is something to remove
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted" in err, "".join(said) + err
    assert "Traceback" not in err
    assert not (out / "worktrees").exists() and state(root) == before
