"""The parent never writes through, nor waits on, what a worker could have left at a name
it later writes or reads (gatekeeper/safefs.py, docs/hardening.md "The parent's
files"): a symbolic link, a hard link or a FIFO planted at the name of results.json,
the report, the bundle being packed, a file of the cache dir it packs or fills, the
worker's answer and its breadcrumb. Each operation runs in a process of its own with a
time limit (before, a FIFO made the parent wait for ever)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="links and FIFOs")

VICTIM = "a file the parent must never write\n"


def _plant(folder: Path, name: str, victim: Path, how: str) -> None:
    path = folder / name
    if how == "symlink":
        path.symlink_to(victim)
    elif how == "hardlink":
        os.link(victim, path)
    else:
        os.mkfifo(path)


def _run(code: str, **paths: Path) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (the paths given as variables), 60 s at most."""
    head = "".join(f"{k} = Path({str(v)!r})\n" for k, v in paths.items())
    full = "from pathlib import Path\n" + head + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", full], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("how", ["symlink", "hardlink", "fifo"])
def test_results_and_reports_replace_what_was_planted_at_their_names(tmp_path, how) -> None:
    """Before: ``results.json.part`` and the reports were opened as they were, so a
    link planted at the name (``--out`` in a folder a worker could write: the temp dir,
    ``/dev/shm``) had the parent write its document into the link's target, and a FIFO
    made it wait for ever. Now each is a new file renamed over the name."""
    victim, out = tmp_path / "victim.py", tmp_path / "out"
    victim.write_text(VICTIM)
    out.mkdir()
    for name in ("results.json.part", "results.json", "report.md", "report.json"):
        _plant(out, name, victim, how)
    proc = _run(
        """
        from gatekeeper.gate import GateReport
        from gatekeeper.report import write_report
        from gatekeeper.results import Results, write_results

        results = Results(created_at="t", gatekeeper_version="0", creator={}, base_ref="main",
                          targets=[])
        write_results(results, out)
        write_report(GateReport("pass", 0, "main", []), out / "report.md")
        """,
        out=out,
    )
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == VICTIM
    for name in ("results.json", "report.md", "report.json"):
        assert (out / name).is_file() and not (out / name).is_symlink(), name
    assert json.loads((out / "results.json").read_text())["base_ref"] == "main"
    assert "unconfined" not in (out / "results.json").read_text()  # a boxed run's, as it was


def test_the_bundle_packs_only_plain_files_and_never_through_a_planted_part(tmp_path) -> None:
    """Before: ``bundle.pack`` wrote ``bundle.tar.zst.part`` beside the worker's cache dir
    with a plain open, so a link planted there (``$TORCHINDUCTOR_CACHE_DIR/..``) made
    ``compile`` overwrite a tracked file with the archive, and a FIFO in the cache dir
    hung it. Now the archive is a new file renamed to its name, and a member is packed
    only when it is a plain file (a link or FIFO of the worker's is left out)."""
    victim, cache, dest = tmp_path / "victim.py", tmp_path / "cache", tmp_path / "dest"
    victim.write_text(VICTIM)
    (cache / "fxgraph").mkdir(parents=True)
    dest.mkdir()
    (cache / "fxgraph" / "entry").write_bytes(b"kernel")
    _plant(cache / "fxgraph", "link", victim, "symlink")
    _plant(cache / "fxgraph", "fifo", victim, "fifo")
    (cache / "linked-folder").symlink_to(tmp_path)
    _plant(dest, "bundle.tar.zst.part", victim, "symlink")
    proc = _run(
        """
        from gatekeeper import bundle

        archive, manifest = bundle.pack(
            cache, None, dest, target="m/b1/default",
            key={"env_key": "e", "code_hash": "c"}, compile_info={}, creator={},
            version="0", signing_key=None,
        )
        print(sorted(manifest.files))
        """,
        cache=cache,
        dest=dest,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "['cache/fxgraph/entry']", proc.stdout
    assert victim.read_text() == VICTIM


@pytest.mark.parametrize("how", ["symlink", "fifo"])
def test_an_answer_or_breadcrumb_that_is_not_a_plain_file_is_one_line(tmp_path, how) -> None:
    """A worker's answer or breadcrumb left as a link (to a file of the parent's) or a
    FIFO is refused in one line, never followed, never waited on."""
    victim, own = tmp_path / "victim.json", tmp_path / "box"
    victim.write_text('{"ok": true}')
    own.mkdir()
    _plant(own, "response.json", victim, how)
    _plant(own, "response.json.step", victim, how)
    proc = _run(
        """
        from gatekeeper.boundary import breadcrumbs
        from gatekeeper.boundary.spawn import read_answer
        from gatekeeper.errors import WorkerError

        print(breadcrumbs.read(own / "response.json", -11).step)
        try:
            read_answer(own / "response.json", "m/b1/default")
        except WorkerError as e:
            print(e)
        """,
        own=own,
    )
    assert proc.returncode == 0, proc.stderr
    step, said = proc.stdout.splitlines()
    assert step == "None"
    assert said.startswith("m/b1/default: response.json refused unread"), said


def test_a_cache_dir_a_worker_wrote_is_filled_without_following_its_links(tmp_path) -> None:
    """``warm`` fills a cache dir a worker also wrote (a probe's): a folder planted as a
    link elsewhere, and a link at a file's name, are replaced, never written through."""
    victim, elsewhere = tmp_path / "victim.py", tmp_path / "elsewhere"
    victim.write_text(VICTIM)
    elsewhere.mkdir()
    src, cache = tmp_path / "staging", tmp_path / "cache"
    (src / "fxgraph").mkdir(parents=True)
    (src / "fxgraph" / "entry").write_bytes(b"kernel")
    (src / "top.bin").write_bytes(b"top")
    cache.mkdir()
    (cache / "fxgraph").symlink_to(elsewhere)
    (cache / "top.bin").symlink_to(victim)
    proc = _run(
        "from gatekeeper import bundle\nprint(bundle.install_tree(src, cache))\n",
        src=src,
        cache=cache,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "2"
    assert victim.read_text() == VICTIM and list(elsewhere.iterdir()) == []
    assert (cache / "fxgraph").is_dir() and not (cache / "fxgraph").is_symlink()
    assert (cache / "fxgraph" / "entry").read_bytes() == b"kernel"
    assert (cache / "top.bin").read_bytes() == b"top"
