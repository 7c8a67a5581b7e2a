"""Workers forked from a warm server (gatekeeper/boundary/forks.py,
gatekeeper/worker/server.py) keep the promises of a fresh worker per target (issue 52):
each child is in its box before the model's code runs, starts with clean counters, and a
crash ends its own target only. The factories say what they saw in the one line a
failed build reports (a channel no box can close), so each test reads it from there.

Two tiny models: ``gatekeeper key`` (one worker that builds the model, no compile) for
the box and the clean start; one ``gatekeeper compile`` of two targets for the crash."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from support.helpers import TINY_MODEL, gk, gk_json, write_project

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forks and boxes are Linux's")

SEEN = textwrap.dedent("""
    import json, os, sys

    def modules():  # the torch modules loaded: their count and a digest of their names
        import hashlib
        names = sorted(m for m in sys.modules if m.startswith("torch"))
        return f"{len(names)}:{hashlib.sha256(repr(names).encode()).hexdigest()[:12]}"

    def seen():
        import torch
        from torch._dynamo.utils import counters
        try:
            open(os.path.join(os.path.dirname(__file__), "planted.txt"), "w")
            checkout = "written"
        except OSError as e:
            checkout = e.strerror
        try:
            import socket
            where, _, token = os.environ["MY_SERVER"].partition("#")
            s = socket.socket(socket.AF_UNIX)
            s.connect(where)
            s.sendall(json.dumps({"token": token}).encode() + b"\\n")
            server = "served" if b"ready" in s.recv(4096) else "refused"
        except OSError as e:
            server = "refused: " + (e.strerror or type(e).__name__)
        import gc
        status = dict(ln.split(":", 1) for ln in open("/proc/self/status"))
        doc = {
            "torch_modules": modules(),
            "frozen": gc.get_freeze_count(),
            "peak_kib": int(status["VmHWM"].split()[0]),
            "forked": "gatekeeper.worker.server" in open("/proc/self/cmdline").read(),
            "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
            "counters": sum(len(v) for v in counters.values()),
            "checkout": checkout,
            "server": server,
        }
        raise RuntimeError("SEEN " + json.dumps(doc))
""")


def _seen(stderr: str) -> dict:
    import json

    line = next(ln for ln in stderr.splitlines() if "SEEN " in ln)
    return json.loads(line.split("SEEN ", 1)[1].split("}", 1)[0] + "}")


def _key_seen(root: Path, env: dict[str, str]) -> dict:
    """What the factory of ``gatekeeper key``'s worker (it builds the model) saw."""
    model = TINY_MODEL.replace("def make():\n", "def make():\n    seen()\n") + SEEN
    config = (
        "[tool.gatekeeper]\nstore = 'store'\npass_env = ['MY_SERVER']\n\n"
        "[[tool.gatekeeper.models]]\nname = 'tiny'\nfactory = 'tinymodel:make'\n"
        "inputs = [{ shape = [4, 16] }]\n"
    )
    write_project(root, model, config)
    first = os.environ.get("GATEKEEPER_FORK_SERVER", "#").split(",")[0]  # PATH#TOKEN
    proc = gk("key", cwd=root, env={"MY_SERVER": first, **env})
    assert proc.returncode == 2 and "SEEN " in proc.stderr, proc.stderr
    return _seen(proc.stderr) | {"root": root}


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory, fork_server: Path | None) -> dict:
    """What a forked worker's factory saw."""
    if fork_server is None:
        pytest.skip("GATEKEEPER_FORKS=off: workers are fresh processes")
    return _key_seen(tmp_path_factory.mktemp("forks") / "p", {})


def test_a_forked_worker_is_a_child_of_the_server_in_its_own_box(seen: dict) -> None:
    """The worker was forked (its command line is the server's: no new interpreter),
    sees only its box's processes (its init and itself) and cannot write the checkout."""
    assert seen["forked"], seen
    assert seen["processes"] == [1, 2], seen
    assert seen["checkout"] == "Read-only file system", seen
    assert not (seen["root"] / "planted.txt").exists()


def test_a_forked_worker_starts_with_clean_counters(seen: dict) -> None:
    """Dynamo's counters are empty when the factory runs (the server compiles nothing)."""
    assert seen["counters"] == 0, seen


def test_a_fresh_worker_and_a_forked_one_build_the_model_in_the_same_process_state(
    seen: dict, tmp_path: Path
) -> None:
    """A target reads the same forked as fresh: when its model is built, a fresh worker
    has imported what the server imported (gatekeeper/worker/imports.py: torch, Dynamo,
    inductor), so neither's compile seconds count an import and both record their
    dependencies against the same loaded modules; both moved those objects out of the
    collector's sight; and the forked child has mapped the library pages the server's
    imports mapped, so its peak resident set stands where a fresh worker's does. Before,
    the fresh worker imported inductor inside its first compile (0.5-0.7 s of the quick
    start's compile seconds) and the forked child's peak read 15% lower (file pages a
    fork does not copy)."""
    fresh = _key_seen(tmp_path / "p", {"GATEKEEPER_FORKS": "off"})
    assert not fresh["forked"] and seen["forked"], (fresh, seen)
    assert fresh["torch_modules"] == seen["torch_modules"], (fresh, seen)
    assert fresh["frozen"] > 0 and seen["frozen"] > 0, (fresh["frozen"], seen["frozen"])
    ratio = seen["peak_kib"] / fresh["peak_kib"]
    assert 0.93 < ratio < 1.07, (seen["peak_kib"], fresh["peak_kib"])


def test_a_boxed_worker_cannot_ask_the_server_for_a_fork(seen: dict) -> None:
    """Model code that knows the session server's socket and token is refused: the
    server serves only clients outside every box (its namespaces), whatever they hold."""
    assert seen["server"] != "served", seen


CRASHING = textwrap.dedent("""
    import os, signal
    import torch
    from torch import nn

    class Crashing(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 4)

        def forward(self, x):
            os.kill(os.getpid(), signal.SIGKILL)  # mid-compile: Dynamo runs it at its break
            return self.fc(x)

    def make():
        return Crashing()
""")

TWO = textwrap.dedent("""
    [tool.gatekeeper]
    store = "store"
    precompile = "off"

    [[tool.gatekeeper.models]]
    name = "crashing"
    factory = "crashing:make"
    inputs = [{ shape = [4, 16] }]

    [[tool.gatekeeper.models]]
    name = "tiny"
    factory = "tinymodel:make"
    inputs = [{ shape = [4, 16] }]
""")


def test_a_forked_child_killed_mid_compile_fails_only_its_target(tmp_path: Path) -> None:
    """One run, two targets from one server: the child that is killed (SIGKILL) while
    it compiles fails its target in one line naming the signal; the other target, forked
    after it from the same server, still publishes."""
    root = write_project(tmp_path / "p", TINY_MODEL, TWO)
    (root / "crashing.py").write_text(CRASHING)
    doc = gk_json("compile", cwd=root, expect=2)
    rows = {t["target"].split("/")[0]: t for t in doc["targets"]}
    assert rows["tiny"]["status"] == "published", rows
    crashed = rows["crashing"]
    assert crashed["status"] != "published" and "SIGKILL" in str(crashed), crashed


def test_a_run_with_one_openmp_thread_forks_from_the_sessions_server_for_it(
    tmp_path: Path, fork_server: Path | None
) -> None:
    """Most end-to-end runs set ``OMP_NUM_THREADS=1`` (``QUIET``): the session has a
    server for that environment too, so such a run forks its worker from it instead of
    starting (and importing torch in) a server of its own."""
    if fork_server is None:
        pytest.skip("GATEKEEPER_FORKS=off: workers are fresh processes")
    from support.projects import QUIET

    said = "raise RuntimeError('CMDLINE ' + open('/proc/self/cmdline').read().replace('\\0', ' '))"
    root = write_project(
        tmp_path / "p", TINY_MODEL.replace("def make():\n", f"def make():\n    {said}\n")
    )
    proc = gk("key", cwd=root, env=QUIET)
    assert proc.returncode == 2, proc.stderr
    line = next(ln for ln in proc.stderr.splitlines() if "CMDLINE " in ln)
    assert "gatekeeper.worker.server --listen" in line and "fork-quiet.sock" in line, line
