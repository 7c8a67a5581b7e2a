"""Model code stays in its box (gatekeeper/boundary/confine.py, gatekeeper/git.py,
gatekeeper/boundary/spawn.py), against the real thing: a factory that tries every way out
we know of (a git hook and config, a filter driver, a ``git`` planted on ``PATH``, the
runner's file commands, a daemon in a session of its own, the checkout) while the real
CLI compiles it, and the real git the parent runs afterwards."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support.helpers import TINY_CONFIG, TINY_MODEL, git, gk, write_project
from support.outbox import Outbox

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the box is Linux's")

# what the job's environment holds that no worker may see, whatever the names say
CREDENTIALS = {
    "PGPASSWORD": "pg-needle-51c2",
    "MYSQL_PWD": "mysql-needle-0a7e",
    "DATABASE_URL": "postgres://u:db-needle-93f1@h/d",
    "SSH_KEY": "ssh-needle-6b0d",
    "DEPLOY_KEY": "deploy-needle-c4a8",
}

ESCAPES = textwrap.dedent("""
    import atexit, json, os, pathlib, subprocess, sys

    def _try(what, do):
        try:
            do()
            return "done"
        except Exception as e:
            return f"refused: {type(e).__name__}: {e}"

    def _write(path, text, mode=0o644):
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(text)
        os.chmod(path, mode)

    def _plant_header():
        # the precompiled C++ headers every later compile includes: lent to the worker
        # (linked into its temp dir), or named by GATEKEEPER_PCH_DIR (before issue 54)
        import glob
        tmp = os.environ.get("TMPDIR", "/tmp")
        lent = glob.glob(os.path.join(tmp, "torchinductor_*", "precompiled_headers", "*.h"))
        shared = os.environ.get("GATEKEEPER_PCH_DIR")
        aims = [os.path.realpath(p) for p in lent]
        aims += [os.path.join(shared, "planted.h")] if shared else []
        if not aims:
            raise LookupError("no shared header to plant in")
        for aim in aims:
            _write(aim, "#error planted\\n")

    def escape():
        here = pathlib.Path(__file__).parent
        plan = json.loads((here / "escape.json").read_text())
        marker = plan["marker"]
        hook = f"#!/bin/sh\\necho ran >> {marker}\\n"
        git_dir = here / ".git"
        done = {"env": sorted(os.environ)}
        done["hooksPath"] = _try("hooksPath", lambda: subprocess.run(
            ["git", "-C", str(here), "config", "core.hooksPath", plan["hooks"]],
            check=True, capture_output=True))
        # the hook itself, outside the checkout (this test wrote it too: the box now
        # leaves the temp dir read-only)
        _try("hook file", lambda: _write(pathlib.Path(plan["hooks"], "post-checkout"), hook, 0o755))
        hooks = git_dir / "hooks" / "post-checkout"
        done["hook"] = _try("hook", lambda: _write(hooks, hook, 0o755))
        driver = f"[filter \\"evil\\"]\\n\\tclean = sh -c 'echo ran >> {marker}; cat'\\n"
        done["filter"] = _try("filter", lambda: (
            _write(git_dir / "info" / "attributes", "* filter=evil\\n"),
            _write(git_dir / "config", driver)))
        monitor = f"[core]\\n\\tfsmonitor = {plan['hooks']}/post-checkout\\n"
        done["fsmonitor"] = _try("fsmonitor", lambda: _write(git_dir / "config", monitor))
        planted = pathlib.Path(plan["path_dir"], "git")
        done["git"] = _try("git", lambda: _write(planted, hook, 0o755))
        steer = "BASH_ENV=/x\\n"
        done["github_env"] = _try("github_env", lambda: _write(plan["github_env"], steer))
        done["file_commands"] = _try("file_commands", lambda: _write(plan["file_command"], steer))
        done["checkout"] = _try("checkout", lambda: _write(here / "gatekeeper.toml", "# x\\n"))
        # what Triton does at a GPU's first compile: its driver stubs under ~/.triton/cache
        # (~ being TRITON_HOME where set); a compile on an H200 failed on '/root/.triton'
        home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
        triton = pathlib.Path(home, ".triton", "cache", "stub.txt")
        done["triton"] = _try("triton", lambda: _write(triton, "x"))
        done["triton_path"] = str(triton)
        done["headers"] = _try("headers", _plant_header)
        daemon = subprocess.Popen(
            ["sleep", "300", plan["daemon"]], start_new_session=True, env={},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        done["daemon"] = daemon.pid
        # at exit, after the worker wrote its answer: a 2 GiB answer (sparse: no disk)
        done.update(_parents_files(plan), dev=_root_over_the_host(), status=_status())
        # at exit, after the worker wrote its answer: a 2 GiB answer (sparse: no disk)
        atexit.register(lambda: os.truncate(sys.argv[2], 2**31 + 1))
        with open(plan["outbox"], "w") as f:  # a FIFO: the box leaves nothing else to write
            f.write(json.dumps(done) + "\\n")

    def _parents_files(plan):
        # where the parent writes or reads: its temp dir (the run's folder above the
        # worker's own, the cache dir's parent where a compile packs its bundle), the
        # machine's /tmp, and /dev/shm
        own = os.environ["TMPDIR"]
        run = os.path.dirname(own)
        victim = plan["victim"]
        done = {}
        for name in ("request.json.part", "results.json.part", "bundle.tar.zst.part"):
            done[f"run:{name}"] = _try(name, lambda: os.symlink(victim, os.path.join(run, name)))
        cache = os.path.dirname(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        part = os.path.join(cache, "bundle.tar.zst.part")
        done["cache_parent:link"] = _try("link", lambda: os.symlink(victim, part + ".l"))
        done["cache_parent:hard"] = _try("hard", lambda: os.link(victim, part + ".h"))
        done["cache_parent:fifo"] = _try("fifo", lambda: os.mkfifo(part + ".f"))
        done["tmp"] = _try("tmp", lambda: _write(f"/tmp/{plan['tag']}", "x"))
        done["shm"] = _try("shm", lambda: _write(f"/dev/shm/{plan['tag']}", "x"))
        done["own"] = _try("own", lambda: _write(os.path.join(own, "mine.txt"), "x"))
        with open(victim) as f:  # what the box leaves open: reading what its user may
            done["read"] = f.read()
        return done

    def _root_over_the_host():
        import stat
        found = {"listing": sorted(os.listdir("/dev"))}
        found["create"] = _try("create", lambda: _write("/dev/gk-planted", "x"))
        node = os.path.join(os.environ["TMPDIR"], "blk")
        block = 0o600 | stat.S_IFBLK
        found["mknod"] = _try("mknod", lambda: os.mknod(node, block, os.makedev(7, 0)))
        disks = sorted(os.listdir("/sys/class/block")) or ["vda"]  # the host's, by name
        found["block"] = _try("block", lambda: os.close(os.open(f"/dev/{disks[0]}", os.O_RDWR)))
        return found

    def _status():
        lines = pathlib.Path("/proc/self/status").read_text().splitlines()
        wanted = ("CapEff", "CapPrm", "CapBnd", "CapAmb", "NoNewPrivs")
        return {k: v.strip() for k, _, v in (ln.partition(":") for ln in lines) if k in wanted}
""")


def _escaping_project(root: Path, tmp: Path, outbox: Outbox) -> dict:
    """A committed project whose factory tries every escape; what it aims at."""
    model = TINY_MODEL.replace("def make():\n", "def make():\n    escape()\n") + ESCAPES
    config = TINY_CONFIG.replace('store = "store"', 'store = "store"\npass_env = ["MY_*"]')
    write_project(root, model, config)
    (root / ".gitignore").write_text("store/\n__pycache__/\nescape.json\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    runner_temp = tmp / "runner-temp"
    plan = {
        "marker": str(tmp / "ran-outside.txt"),
        "outbox": str(outbox.path),
        "hooks": str(tmp / "hooks"),
        "path_dir": str(tmp / "bin"),
        "github_env": str(runner_temp / "_runner_file_commands" / "set_env_1"),
        "file_command": str(runner_temp / "_runner_file_commands" / "add_path_1"),
        "daemon": f"gk-daemon-{time.time_ns()}",
        "tag": f"gk-planted-{time.time_ns()}",
        "victim": str(tmp / "victim.txt"),
        "runner_temp": str(runner_temp),
    }
    Path(plan["victim"]).write_text("the parent's\n")
    hook = Path(plan["hooks"], "post-checkout")
    hook.parent.mkdir()
    hook.write_text(f"#!/bin/sh\necho ran >> {plan['marker']}\n")
    hook.chmod(0o755)
    for folder in ("bin", "runner-temp/_runner_file_commands"):
        (tmp / folder).mkdir(parents=True)
    for name in ("github_env", "file_command"):
        Path(plan[name]).write_text("")
    (root / "escape.json").write_text(json.dumps(plan))
    return plan


def _daemons(tag: str) -> list[int]:
    found = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and tag.encode() in (p / "cmdline").read_bytes():
                found.append(int(p.name))
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def escaped(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, Path, str]:
    """One worker of the escaping model (`gatekeeper key` builds it), then git as the parent
    runs it; what the factory did, the plan, the project, and the checkout's status."""
    tmp = tmp_path_factory.mktemp("box")
    root = tmp / "p"
    outbox = Outbox()
    plan = _escaping_project(root, tmp, outbox)
    env = {
        **CREDENTIALS,
        "PATH": f"{plan['path_dir']}{os.pathsep}{os.environ['PATH']}",
        "RUNNER_TEMP": plan["runner_temp"],
        "GITHUB_ENV": plan["github_env"],
        "MY_MODEL_SETTING": "passed",
    }
    proc = gk("key", "--json", cwd=root, env=env)
    (report,) = outbox.docs()
    # its answer was 2 GiB: one line, refused unread (it used to be read whole)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "refused unread: 2147483649 bytes" in proc.stderr, proc.stderr
    # the parent's own git after a worker ran in its checkout (paired check, bisect)
    from gatekeeper.git import git as parents_git

    parents_git(root, "worktree", "add", "--detach", str(tmp / "base"), "HEAD")
    status = parents_git(root, "status", "--porcelain")
    return report, plan, root, status


def test_an_answer_of_2_gib_is_one_line_not_an_out_of_memory(escaped) -> None:
    """The fixture's ``gatekeeper key`` got a 2 GiB answer (checked there: one line,
    exit 2); its memory never held it (the parent reads at most the cap)."""
    report = escaped[0]
    assert "daemon" in report  # the factory ran to its end, and the answer was written


def test_nothing_the_factory_writes_runs_outside_the_box(escaped) -> None:
    """Before the box: ``git config core.hooksPath`` from the factory made the parent's
    next ``git worktree add`` run its hook, and a ``git`` planted on PATH ran instead of
    git (the parent's provenance); now each write is refused and nothing of theirs runs."""
    report, plan, _, _ = escaped
    assert not Path(plan["marker"]).exists(), Path(plan["marker"]).read_text()
    for way in ("hooksPath", "hook", "filter", "fsmonitor", "git"):
        assert report[way].startswith("refused"), (way, report[way])
    assert not Path(plan["path_dir"], "git").exists()


def test_the_factory_cannot_change_the_checkout_or_steer_later_steps(escaped) -> None:
    """The runner's file commands (GITHUB_ENV, $RUNNER_TEMP/_runner_file_commands) and the
    checkout stay as they were: a later step runs nothing the model wrote."""
    report, plan, root, status = escaped
    for way in ("github_env", "file_commands", "checkout"):
        assert "Read-only file system" in report[way], (way, report[way])
    assert Path(plan["github_env"]).read_text() == ""
    assert Path(plan["file_command"]).read_text() == ""
    assert status == ""  # no tracked file changed
    assert "# x" not in (root / "gatekeeper.toml").read_text()


def test_the_shared_precompiled_headers_are_read_only_in_the_box(escaped) -> None:
    """The headers every later compile includes (lent to the worker by links into its
    temp dir) cannot be changed from the box: a planted ``#error`` (or worse) would
    compile into main's next bundle. Before issue 54 the folder was the worker's to write
    (GATEKEEPER_PCH_DIR)."""
    report = escaped[0]
    assert "Read-only file system" in report["headers"], report["headers"]
    shared = Path(os.environ["GATEKEEPER_PCH_DIR"])
    assert not (shared / "planted.h").exists()
    assert all("planted" not in p.read_text() for p in shared.glob("*.h"))


def test_tritons_home_is_writable_in_the_box_and_not_the_users(escaped) -> None:
    """Triton writes its driver stubs under ``~/.triton`` on a GPU's first compile; in the
    box the home is read-only, so every CUDA compile failed (an H200, 2026-11-28) until
    the worker's TRITON_HOME became its cache dir: the write succeeds, outside the home."""
    report = escaped[0]
    assert report["triton"] == "done", report["triton"]
    assert not Path(report["triton_path"]).is_relative_to(Path.home()), report["triton_path"]


def test_the_workers_environment_is_an_allow_list(escaped) -> None:
    """Credentials whatever their names, and the runner's file-command paths, never
    reach the worker; a name the config's pass_env lists does."""
    env = escaped[0]["env"]
    assert not set(CREDENTIALS) & set(env), env
    assert not {"RUNNER_TEMP", "GITHUB_ENV"} & set(env), env
    assert "MY_MODEL_SETTING" in env and "PATH" in env


def test_a_daemon_in_a_session_of_its_own_dies_with_the_worker(escaped) -> None:
    """A child the factory started with start_new_session=True and an empty environment
    (no marker to sweep by) is gone when gatekeeper returns: the box's PID namespace
    ended with its worker."""
    assert _daemons(escaped[1]["daemon"]) == []


def test_the_parents_git_runs_nothing_a_repository_configures(tmp_path: Path) -> None:
    """Were a worker ever to write .git (an older box, a store outside it), the parent's
    git still runs no hook, fsmonitor or filter the repository names, and runs the git
    it found before the first worker, not one planted on PATH afterwards."""
    root = tmp_path / "r"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "f.txt").write_text("a\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    marker, hooks, bin_dir = tmp_path / "ran.txt", tmp_path / "hooks", tmp_path / "bin"
    hooks.mkdir()
    bin_dir.mkdir()
    script = f"#!/bin/sh\necho ran >> {marker}\n"
    for path in (hooks / "post-checkout", hooks / "fsmon", bin_dir / "git"):
        path.write_text(script)
        path.chmod(0o755)
    git(root, "config", "core.hooksPath", str(hooks))
    git(root, "config", "core.fsmonitor", str(hooks / "fsmon"))
    git(root, "config", "filter.evil.clean", f"sh -c 'echo ran >> {marker}; cat'")
    (root / ".git" / "info" / "attributes").write_text("* filter=evil\n")
    (root / "f.txt").write_text("b\n")
    code = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from gatekeeper import git
        git.resolve()  # what run_worker does before the first worker
        os.environ["PATH"] = {str(bin_dir)!r} + os.pathsep + os.environ["PATH"]
        root = Path({str(root)!r})
        git.git(root, "status", "--porcelain")
        git.git(root, "diff", "--stat")
        git.git(root, "worktree", "add", "--detach", {str(tmp_path / "wt")!r}, "HEAD")
        print(git.git(root, "rev-parse", "HEAD"))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists(), marker.read_text()


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root to become an unprivileged user (setpriv)",
)
def test_the_box_holds_for_an_unprivileged_user() -> None:
    """The path a runner that is not root takes (a user namespace of its own): run as
    ``nobody``, the box still refuses a read-only folder inside a writable one, gives a
    PID namespace of its own and a private loopback, and leaves no daemon behind."""
    import tempfile

    import gatekeeper.boundary.confine as confine

    tmp_path = Path(tempfile.mkdtemp(prefix="gk-nobody-"))  # pytest's is root's only
    for name in ("w", "w/code"):
        (tmp_path / name).mkdir()
    os.chmod(tmp_path, 0o777)
    for name in ("w", "w/code"):
        os.chmod(tmp_path / name, 0o777)
    tag = f"gk-nobody-{time.time_ns()}"
    script = (
        f"touch {tmp_path}/w/ok && echo writable; touch {tmp_path}/w/code/x || echo refused; "
        "echo pid $$; cat /proc/self/uid_map; "
        f"setsid sleep 300 {tag} >/dev/null 2>&1 & exit 0"
    )
    proc = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]
        + [sys.executable, "-I", "-S", confine.__file__]
        + ["--writable", str(tmp_path / "w"), "--read-only", str(tmp_path / "w" / "code")]
        + ["--private-net", "--", "/bin/sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    if "no namespace of its own" in proc.stderr:
        pytest.skip("this kernel gives no user namespace to an unprivileged process")
    lines = proc.stdout.split("\n")
    assert lines[:3] == ["writable", "refused", "pid 2"], proc.stdout + proc.stderr
    assert lines[3].split() == ["65534", "65534", "1"], proc.stdout
    assert "gatekeeper worker:" not in proc.stderr, proc.stderr  # no step refused
    assert "w/code/x': Read-only file system" in proc.stderr, proc.stderr
    time.sleep(0.3)
    assert _daemons(tag) == []
    shutil.rmtree(tmp_path)


REFUSED = ("Read-only file system", "Invalid cross-device link")


def test_the_parents_files_are_out_of_the_boxs_reach(escaped) -> None:
    """Before: the box left the parent's temp dir writable, and a model symlinked
    ``bundle.tar.zst.part`` (beside its cache dir) to a tracked file, which ``compile``
    then overwrote with the bundle. Now the run's folder above the worker's own, the
    cache dir's parent and the machine's ``/tmp`` refuse every link, hard link and FIFO;
    ``/dev/shm`` is the box's own (gone with it); the worker's own folder is its to
    write."""
    report, plan = escaped[0], escaped[1]
    planted = ("run:request.json.part", "run:results.json.part", "run:bundle.tar.zst.part", "tmp")
    planted += ("cache_parent:link", "cache_parent:hard", "cache_parent:fifo")
    for way in planted:
        assert any(why in report[way] for why in REFUSED), (way, report[way])
    assert report["own"] == "done" and report["shm"] == "done", report
    assert not Path("/dev/shm", plan["tag"]).exists()
    assert not Path("/tmp", plan["tag"]).exists()
    assert Path(plan["victim"]).read_text() == "the parent's\n"


def test_root_in_the_box_is_not_root_over_the_host(escaped) -> None:
    """Before: ``/dev`` was the host's and writable, and ``CAP_MKNOD`` kept: a root
    worker created a file in ``/dev`` and made a block device node. Now ``/dev`` is the
    box's own, read-only, with the usual nodes only (no disk to open), and the worker
    holds no capability at all, with ``no_new_privs``."""
    dev, status = escaped[0]["dev"], escaped[0]["status"]
    usual = {"null", "zero", "full", "random", "urandom", "tty", "shm"}
    assert set(dev["listing"]) == usual | {"fd", "stdin", "stdout", "stderr"}, dev["listing"]
    assert "Read-only file system" in dev["create"], dev
    assert "Operation not permitted" in dev["mknod"], dev
    assert "No such file or directory" in dev["block"], dev
    for caps in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
        assert int(status[caps], 16) == 0, status
    assert status["NoNewPrivs"] == "1", status


def test_a_config_naming_a_credential_in_pass_env_is_one_line_before_any_worker(
    tmp_path: Path,
) -> None:
    """Before: these five names in the pull request's own ``pass_env`` passed their
    values to the worker. Now the config is refused as it loads: one line naming the
    first and the workflow's way to let it through, exit 2, no worker started."""
    names = json.dumps(list(CREDENTIALS))
    config = TINY_CONFIG.replace('store = "store"', f'store = "store"\npass_env = {names}')
    root = write_project(tmp_path / "p", TINY_MODEL, config)
    proc = gk("key", "--json", cwd=root, env=CREDENTIALS)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "'PGPASSWORD' may name a credential" in proc.stderr, proc.stderr
    assert "GATEKEEPER_PASS_SECRETS=PGPASSWORD" in proc.stderr, proc.stderr
    assert not any(v in proc.stderr + proc.stdout for v in CREDENTIALS.values())


def test_what_the_box_leaves_open(escaped) -> None:
    """The box is about writing and processes, not reading: model code reads what its
    user may read (docs/hardening.md, "What it cannot promise"), here a file of this
    test's in the parent's temp dir."""
    assert escaped[0]["read"] == "the parent's\n"


PLANTER = textwrap.dedent("""
    def plant():
        # links, hard links and FIFOs in the cache dir the parent packs, and at the
        # name beside it where the bundle used to be packed
        import json, os, pathlib
        victim = json.loads((pathlib.Path(__file__).parent / "victim.json").read_text())
        cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        zz = os.path.join(cache, "zz")
        os.makedirs(zz, exist_ok=True)
        for make in (
            lambda: os.symlink(victim, os.path.join(zz, "link")),
            lambda: os.mkfifo(os.path.join(zz, "fifo")),
            lambda: os.link(victim, os.path.join(zz, "hard")),
            lambda: os.symlink(os.path.dirname(victim), os.path.join(cache, "zz-folder")),
            lambda: os.symlink(victim, os.path.join(cache, "..", "bundle.tar.zst.part")),
            lambda: os.mkfifo(os.path.join(cache, "..", "bundle.tar.zst.part")),
        ):
            try:
                make()
            except OSError:
                pass
""")


def test_a_compile_packs_only_the_plain_files_its_worker_left(tmp_path: Path) -> None:
    """Before: the box left the compile's scratch writable, and ``bundle.pack`` opened
    ``bundle.tar.zst.part`` beside the cache dir as it was: a link planted there had
    ``compile`` write the archive into a tracked file. Now nothing beside the cache dir
    is the worker's, and of the cache dir only plain files are packed: the bundle is
    published, verifies, and holds none of what was planted; the victim is untouched."""
    root = tmp_path / "p"
    model = TINY_MODEL.replace("def make():\n", "def make():\n    plant()\n") + PLANTER
    write_project(root, model)
    victim = tmp_path / "victim.py"
    victim.write_text("the checkout's\n")
    (root / "victim.json").write_text(json.dumps(str(victim)))
    proc = gk("compile", "--json", cwd=root)
    assert proc.returncode == 0, proc.stderr
    (target,) = json.loads(proc.stdout)["targets"]
    assert target["status"] == "published", target
    assert victim.read_text() == "the checkout's\n"
    (manifest,) = (root / "store").rglob("manifest.json")
    files = json.loads(manifest.read_text())["files"]
    assert files and not [f for f in files if "/zz" in f], sorted(files)
    verified = gk("store", "verify", cwd=root)
    assert verified.returncode == 0, verified.stdout + verified.stderr
