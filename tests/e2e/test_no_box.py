"""No box means no run (gatekeeper/boundary/confine.py, gatekeeper/boundary/box.py,
docs/hardening.md "Getting a box"), against the real thing: gatekeeper run as root
without CAP_SYS_ADMIN (a container's default), as a user the kernel gives no user
namespace (tests/support/nobody.py), under a masked /proc; with the runner owner's
opt-out; and a fork bomb in the factory. Before issue 51 each of them ran the model's
code with no box, and said nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import nobody
from support.helpers import TINY_MODEL, parity_only_config, write_project
from support.outbox import Outbox

from gatekeeper import facts_cache

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="the box is Linux's"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to take capabilities away"),
]
CONFINE = Path(__file__).resolve().parents[2] / "gatekeeper" / "boundary" / "confine.py"

# the factory says what it sees from where it runs: its uid map, the processes it can
# see, and whether it can write its own checkout
SEER = TINY_MODEL.replace(
    "def make():\n",
    textwrap.dedent("""
        def make():
            import json, os, pathlib
            here = pathlib.Path(__file__).parent
            seen = {"uid_map": pathlib.Path("/proc/self/uid_map").read_text().split()}
            seen["pids"] = len([p for p in os.listdir("/proc") if p.isdigit()])
            try:
                (here / "planted.py").write_text("import os\\n")
                seen["checkout"] = "written"
            except OSError as e:
                seen["checkout"] = e.strerror
            with open((here / "outbox.txt").read_text(), "w") as f:
                f.write(json.dumps(seen) + "\\n")
    """).lstrip("\n"),
)
BOMB = TINY_MODEL.replace(
    "def make():\n",
    textwrap.dedent("""
        def make():
            import os
            while True:  # a fork bomb: every process forks for ever, refusals or not
                try:
                    os.fork()
                except OSError:
                    pass
    """).lstrip("\n"),
)


def _project(model: str, config: str | None = None) -> tuple[Path, Outbox]:
    """A project any user may read and write (this test's own folder is root's only),
    its factory's outbox, and a home of its own."""
    root = Path(tempfile.mkdtemp(prefix="gk-nobox-"))
    root.chmod(0o777)
    project = write_project(root / "p", model, config or parity_only_config("[{ batch = 4 }]"))
    outbox = Outbox()
    (project / "outbox.txt").write_text(str(outbox.path))
    (root / "home").mkdir()
    for path in [project, *project.iterdir(), root / "home"]:
        path.chmod(0o777 if path.is_dir() else 0o666)
    return project, outbox


def _env(project: Path, **more: str) -> dict[str, str]:
    home = project.parent / "home"
    env = {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / "cache")}
    env["GATEKEEPER_PCH_DIR"] = "off"  # the session's folder is root's only
    env.pop("GATEKEEPER_UNCONFINED", None)
    return env | more


def _as_nobody(project: Path, *args: str, flags=(), **env: str) -> subprocess.CompletedProcess:
    """``gatekeeper ARGS`` as nobody, where the kernel gives it no user namespace."""
    cmd = [sys.executable, nobody.__file__, *flags, "--", sys.executable, "-m", "gatekeeper"]
    return subprocess.run(
        [*cmd, *args],
        cwd=project,
        env=_env(project, **env),
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )


def _one_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr)
    return lines[0]


def test_a_user_without_user_namespaces_is_refused_before_any_model_code() -> None:
    """Before: where the kernel gives a user no user namespace (Ubuntu 24.04's
    restriction, ``user.max_user_namespaces = 0``) the worker ran with no box at all,
    and nothing said so. Now gatekeeper refuses in one line naming why and the way
    out, exit 2, and the factory never ran."""
    project, outbox = _project(SEER)
    said = _one_line(_as_nobody(project, "key", "--json"))
    assert outbox.close() == []  # no model code ran
    assert "no box for model code: no user namespace for this user" in said, said
    assert "user.max_user_namespaces is 0" in said, said
    assert "docs/hardening.md#getting-a-box" in said and "GATEKEEPER_UNCONFINED=1" in said
    shutil.rmtree(project.parent)


def test_a_masked_proc_is_refused_before_any_model_code() -> None:
    """A user namespace, but ``/proc`` with a path mounted over it (a container's
    masked paths): the kernel refuses the box a ``/proc`` of its own, so its PID
    namespace would show the host's processes. Before: the worker ran without one."""
    project, outbox = _project(SEER)
    proc = _as_nobody(project, "key", "--json", flags=("--user-namespaces", "--mask-proc"))
    said = _one_line(proc)
    assert outbox.close() == []
    assert "cannot mount a /proc of its own" in said and "masked paths" in said, said
    shutil.rmtree(project.parent)


def test_with_the_owners_opt_out_it_runs_and_every_report_says_unconfined() -> None:
    """``GATEKEEPER_UNCONFINED=1``, the runner owner's choice in the workflow: the same
    user without user namespaces runs the model (compile, check, gate), and
    results.json, report.md (the PR comment) and report.json say ``unconfined`` and
    why; the torch facts are not remembered (the home was the model's to write)."""
    project, outbox = _project(SEER)
    (project.parent / "tmp").mkdir(mode=0o777)  # the facts are never kept in the temp dir
    (project.parent / "tmp").chmod(0o777)
    proc = _as_nobody(
        project,
        "run",
        "--out",
        "out",
        GATEKEEPER_UNCONFINED="1",
        TMPDIR=str(project.parent / "tmp"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "model code runs unconfined" in proc.stderr, proc.stderr
    seen = outbox.docs()
    assert seen and seen[0]["checkout"] == "written", seen  # no box: what it could do
    why = "no user namespace for this user (user.max_user_namespaces is 0)"
    results = json.loads((project / "out" / "results.json").read_text())
    assert why in results["unconfined"], results.get("unconfined")
    assert "no PID namespace: the worker sees every process" in results["unconfined"]
    report = (project / "out" / "report.md").read_text()
    assert "**unconfined**" in report and "no user namespace for this user" in report, report
    assert why in json.loads((project / "out" / "report.json").read_text())["unconfined"]
    assert not (project.parent / "home" / "cache" / "gatekeeper" / "torch-facts").exists()
    shutil.rmtree(project.parent)


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv")
def test_root_without_cap_sys_admin_gets_its_box_through_a_user_namespace(monkeypatch) -> None:
    """Before: root without CAP_SYS_ADMIN (Docker's default set) got no box: the factory
    saw the host's processes and wrote into the checkout, exit as usual. Now confine.py
    tries a user namespace first (root mapped to itself): the factory sees only its box
    and cannot write the checkout.

    And the torch facts: remembered ones that a model wrote (an unconfined run's, 64
    threads of AVX-512 on this machine) are contradicted by the worker's torch, replaced
    by this process's own, with a warning."""
    project, outbox = _project(SEER)
    (project.parent / "tmp").mkdir()  # the facts are never kept in the temp dir
    env = _env(project, TMPDIR=str(project.parent / "tmp"))
    monkeypatch.setenv("XDG_CACHE_HOME", env["XDG_CACHE_HOME"])
    facts = facts_cache.folder() / f"{facts_cache.fingerprint()}.json"
    facts.parent.mkdir(parents=True)
    forged = {"torch": "2.13.0", "torch_git": "x", "device": "cpu"}
    forged |= {"cpu_capability": "avx512", "threads": 64}
    facts.write_text(json.dumps({"facts:cpu": forged, "auto": "cpu"}))
    no_admin = ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin"]
    proc = subprocess.run(
        [*no_admin, sys.executable, "-m", "gatekeeper", "key", "--json"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    (seen,) = outbox.docs()
    assert seen["uid_map"] == ["0", "0", "1"], seen  # a user namespace, root as itself
    assert seen["pids"] <= 3 and seen["checkout"] == "Read-only file system", seen
    assert "contradict the worker's" in proc.stderr, proc.stderr
    assert json.loads(facts.read_text())["facts:cpu"]["threads"] != 64
    shutil.rmtree(project.parent)


@pytest.fixture
def fenced() -> Iterator[Callable[[list[str]], list[str]]]:
    """``argv`` run inside a pids cgroup of this test's (at most 1024 tasks): whatever a
    broken limit would let a bomb do, this machine keeps its pids."""
    fence = Path("/sys/fs/cgroup/pids", f"gk-test-fence-{os.getpid()}")
    if not os.access(fence.parent, os.W_OK):
        pytest.skip("no pids cgroup to fence the bomb in")
    fence.mkdir()
    (fence / "pids.max").write_text("1024")
    yield lambda argv: ["sh", "-c", f'echo $$ > {fence}/cgroup.procs && exec "$@"', "sh", *argv]
    for _ in range(100):  # its last task leaves it a moment after it died
        try:
            fence.rmdir()
            break
        except OSError:
            time.sleep(0.05)


def test_a_fork_bomb_in_the_factory_is_ended_by_the_process_limit(fenced) -> None:
    """Before: nothing limited a box's processes, so a fork bomb ran until the model's
    ``measure.timeout`` (which the pull request's config sets). Now the box holds at
    most ``GATEKEEPER_MAX_PROCESSES`` (the workflow's) and its init ends the box when a
    fork is refused: one line, exit 2, long before the timeout."""
    config = parity_only_config("[{ batch = 4 }]").replace(
        "min_time = 0.3", "min_time = 0.3\ntimeout = 600"
    )
    project, outbox = _project(BOMB, config)
    cmd = fenced([sys.executable, "-m", "gatekeeper", "key", "--json"])
    env = _env(project, GATEKEEPER_MAX_PROCESSES="64")
    proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    said = _one_line(proc)
    outbox.close()
    assert "the box ended the worker: more than 64 processes" in said, said
    shutil.rmtree(project.parent)


@pytest.mark.parametrize("how", ["nproc", "count"])
def test_the_process_limit_holds_without_a_writable_pids_cgroup(fenced, how) -> None:
    """The same limit where no pids cgroup can be made: a user's RLIMIT_NPROC (in a user
    namespace of its own, counting only the box's processes) and the init's count
    (root, for whom RLIMIT_NPROC is never enforced, with the cgroups read-only)."""
    bomb = (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    box = ["/usr/bin/python3", "-I", "-S", str(CONFINE), "--max-processes", "48"]
    box += ["--status-fd", "2", "--", "/usr/bin/python3", "-S", "-c", bomb]
    if how == "nproc":
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]
    else:
        ro = "mount -o remount,ro,bind /sys/fs/cgroup/pids"
        argv = ["unshare", "-m", "sh", "-c", f'{ro} && exec "$@"', "sh"]
    proc = subprocess.run(
        fenced([*argv, *box]), cwd="/", capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -9 or proc.returncode == 137, (proc.returncode, proc.stderr)
    assert "ended: more than 48 processes" in proc.stderr, proc.stderr
