"""The torch facts a parent remembers for the env key (gatekeeper/facts_cache.py,
docs/caching.md): asked of torch once, then read without importing torch, and asked
again whenever something they follow from changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gatekeeper import facts_cache, runtime

ASK = (
    "import json, sys; from gatekeeper import runtime; "
    "print(json.dumps([runtime.resolve_device('auto'), runtime.torch_facts('cpu'), "
    "'torch' in sys.modules]))"
)


def own_temp(root: Path) -> Path:
    """A temp dir beside the test's cache dir, so that the cache dir is outside it."""
    (root / "tmp").mkdir(exist_ok=True)
    return root / "tmp"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """XDG_CACHE_HOME for this process, outside its temp dir."""
    monkeypatch.setattr(tempfile, "tempdir", str(own_temp(tmp_path)))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def ask(cache: Path, **env: str) -> tuple[str, dict, bool]:
    """resolve_device('auto') and torch_facts('cpu') in a fresh interpreter, and whether
    it imported torch."""
    full = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS",)}
    # a temp dir of its own: the cache dir must not lie in the temp dir (a worker's reach)
    full |= {"XDG_CACHE_HOME": str(cache), "TMPDIR": str(own_temp(cache)), **env}
    out = subprocess.run(
        [sys.executable, "-c", ASK], env=full, capture_output=True, text=True, check=True
    ).stdout
    device, facts, imported = json.loads(out.splitlines()[-1])
    return device, facts, imported


@pytest.mark.e2e  # fresh interpreters importing torch
def test_the_facts_are_asked_once_then_remembered_and_asked_again_when_threads_change(
    tmp_path,
):
    """Catches a cache that ignores what the answers follow from (here OMP_NUM_THREADS:
    torch's thread count, in the env key) and one that never remembers."""
    first = ask(tmp_path, OMP_NUM_THREADS="2")
    assert first[0] == "cpu" and first[2], "the first ask imports torch"
    assert first[1]["threads"] == 2
    again = ask(tmp_path, OMP_NUM_THREADS="2")
    assert again == (first[0], first[1], False), "remembered: torch not imported"
    one = ask(tmp_path, OMP_NUM_THREADS="1")
    assert one[2] and one[1]["threads"] == 1, "a changed variable asks torch again"
    off = ask(tmp_path, OMP_NUM_THREADS="2", GATEKEEPER_FACTS_CACHE="off")
    assert off == (first[0], first[1], True)


def test_the_fingerprint_follows_the_variables_torch_reads(monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    before = facts_cache.fingerprint()
    assert before == facts_cache.fingerprint()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert facts_cache.fingerprint() != before
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    monkeypatch.setenv("GATEKEEPER_UNRELATED", "1")  # not one torch reads: the same
    assert facts_cache.fingerprint() == before


def test_a_remembered_answer_of_the_wrong_shape_is_asked_again(cache):
    truth = runtime.torch_facts("cpu")
    path = next((cache / "gatekeeper" / "torch-facts").glob("*.json"))
    for wrong in (
        {**truth, "threads": "2"},
        {**truth, "device": "cuda"},
        {**truth, "extra": 1},
        "cpu",
    ):
        facts_cache.remember("facts:cpu", wrong)
        assert runtime.torch_facts("cpu") == truth
        assert json.loads(path.read_text())["facts:cpu"] == truth, "written again"
    path.write_text("{not json")
    assert runtime.torch_facts("cpu") == truth


def test_an_unwritable_cache_dir_is_left_alone(cache):
    cache.mkdir()
    (cache / "gatekeeper").write_text("a file where the folder would be")
    assert runtime.torch_facts("cpu")["device"] == "cpu"
    assert facts_cache.recall("facts:cpu") is None


def test_nothing_is_kept_where_a_worker_may_write(cache, monkeypatch):
    """A worker's box writes the temp dir: facts kept there could be changed by model
    code, and with them the env key the parent files bundles under."""
    facts_cache.remember("facts:cpu", runtime.torch_facts("cpu"))
    assert facts_cache.recall("facts:cpu") is not None  # the control: kept outside it
    inside = Path(tempfile.gettempdir(), "xdg")
    monkeypatch.setenv("XDG_CACHE_HOME", str(inside))
    facts_cache.remember("facts:cpu", runtime.torch_facts("cpu"))
    assert facts_cache.recall("facts:cpu") is None and not inside.exists()


def test_another_torch_build_of_the_same_size_and_time_is_a_new_fingerprint(tmp_path, monkeypatch):
    """Images that set every file's time alike: two builds of one version differ only in
    version.py's git hash, which the fingerprint reads."""
    import importlib.machinery

    torch_dir = tmp_path / "torch"
    torch_dir.mkdir()
    (torch_dir / "__init__.py").write_text("")
    version = torch_dir / "version.py"
    spec = importlib.machinery.ModuleSpec("torch", None, origin=str(torch_dir / "__init__.py"))
    monkeypatch.setattr(facts_cache.importlib.util, "find_spec", lambda name: spec)

    def build(git: str) -> str | None:
        version.write_text(f"__version__ = '2.13.0+cpu'\ngit_version = '{git}'\n")
        os.utime(version, ns=(0, 0))
        return facts_cache.fingerprint()

    assert build("a" * 40) == build("a" * 40)
    assert build("a" * 40) != build("b" * 40)
