"""The secrets of a gatekeeper process are out of reach of the model code its workers run
(gatekeeper/secrecy.py, gatekeeper/boundary/confine.py), against the real thing: a model
whose factory walks every ancestor and reads what it can of each (tests/support/snoop.py:
environ, every thread's environ, cmdline, open files, memory), run by the real CLI. A
positive control shows that the same scan finds a secret wherever it may read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support import snoop
from support.helpers import gk
from support.snooping import (
    assert_boxed,
    assert_confined,
    assert_found_nothing,
    parents_code,
    snoop_project,
    snooped,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc and prctl are Linux's")

CONFINE = Path(__file__).resolve().parents[1] / "gatekeeper" / "boundary" / "confine.py"
# what the job holds: every value a needle the snoop looks for
SECRETS = {
    "GATEKEEPER_SIGNING_KEY": "sk-needle-3a9f0c2e51",
    "AWS_ACCESS_KEY_ID": "AKIANEEDLE7Q2W",
    "AWS_SECRET_ACCESS_KEY": "aws-needle-77c1e0b9d4",
    "AWS_SESSION_TOKEN": "aws-session-needle-0c4e",
    "GITHUB_TOKEN": "ghs_needle_5d2a8f11",
    "ACTIONS_RUNTIME_TOKEN": "runtime-needle-9e3b",
    "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "oidc-needle-41d7",
    "INPUT_GITHUB-TOKEN": "input-needle-c8a2",  # a JavaScript action's input
    "HF_TOKEN": "hf_needle_2b6e90",
}


def test_model_code_finds_no_secret_in_any_ancestor(tmp_path: Path) -> None:
    plant = [*parents_code(), str(tmp_path), "$TMPDIR"]
    project = snoop_project(tmp_path / "p", SECRETS, plant=plant)
    proc = gk("key", "--json", cwd=project, env=SECRETS)
    assert proc.returncode == 0, proc.stderr
    doc = snooped(project)
    # its box's PID namespace: no ancestor to walk to but the box's init (before the
    # box, the walk reached the gatekeeper parent and this test)
    assert_boxed(doc)
    assert_found_nothing(doc)
    assert_confined(doc["status"])
    # no code planted where the parent (or a later step) imports from, nor in the
    # parent's temp dir (this test's folder in it); the worker's own folder takes it
    planted = doc["planted"]
    assert planted.pop("$TMPDIR") == "written"
    refused = "refused: Read-only file system"
    assert planted == dict.fromkeys([*parents_code(), str(tmp_path)], refused), planted


def test_the_snoop_finds_a_secret_wherever_it_may_read(tmp_path: Path) -> None:
    """The positive control: a process of this test, dumpable, holding the needles in its
    environment and its memory, scanned from here (root with every capability, or the
    same user): the scan reads them both."""
    needles = {"env": "env-needle-0f3c", "heap": "heap-needle-b71a"}
    script = "import time\nheld = ('heap-' + 'needle-b71a') * 3\nprint(1, flush=True)\n"
    script += "time.sleep(60)"
    victim = subprocess.Popen(
        [sys.executable, "-c", script],
        env={**os.environ, "VICTIM_SETTING": needles["env"]},
        stdout=subprocess.PIPE,
    )
    try:
        assert victim.stdout is not None and victim.stdout.readline().strip() == b"1"
        seen = snoop.scan(victim.pid, {k: v.encode() for k, v in needles.items()})
    finally:
        victim.kill()
        victim.wait()
    assert seen["found"]["environ"] == ["env"], seen
    assert "heap" in seen["found"]["mem"], seen
    assert snoop.ancestors()[0] == os.getppid()


def _sealed(env: dict[str, str], code: str) -> dict:
    """What ``code`` prints (JSON) in a new process that sealed itself as the program does."""
    prelude = "import json, os, ctypes\nfrom gatekeeper import secrecy\nsecrecy.seal(drop=True)\n"
    proc = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_seal_overwrites_the_environment_block_and_keeps_what_is_needed(tmp_path: Path) -> None:
    settings = {"AWS_REGION": "eu-west-3", "GITHUB_EVENT_PATH": str(tmp_path / "event.json")}
    copied = {"MY_COPY_OF_THE_KEY": SECRETS["GATEKEEPER_SIGNING_KEY"]}  # another name
    got = _sealed(
        {**SECRETS, **settings, **copied},
        """
        libc = ctypes.CDLL(None)
        libc.getenv.restype = ctypes.c_char_p
        print(json.dumps({
            "block": open("/proc/self/environ", "rb").read().decode(errors="replace"),
            "environ": sorted(os.environ),
            "getenv": {
                n: (libc.getenv(n.encode()) or b"").decode()
                for n in ("AWS_REGION", "GITHUB_EVENT_PATH", "MY_COPY_OF_THE_KEY")
            },
            "key": secrecy.secret("GATEKEEPER_SIGNING_KEY"),
            "token": secrecy.secret("GITHUB_TOKEN"),
            "aws": secrecy.aws_credentials(),
            "dumpable": libc.prctl(3, 0, 0, 0, 0),
        }))
        """,
    )
    assert not [v for v in SECRETS.values() if v in got["block"]], got["block"]
    assert "GATEKEEPER_SIGNING_KEY=***" in got["block"]  # overwritten in place
    assert not set(SECRETS) & set(got["environ"])  # no child inherits a credential
    assert got["getenv"] == {**settings, **copied}  # C's environment reads as before
    assert got["key"] == SECRETS["GATEKEEPER_SIGNING_KEY"]
    assert got["token"] == SECRETS["GITHUB_TOKEN"]
    assert got["aws"] == {
        "aws_access_key_id": SECRETS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": SECRETS["AWS_SECRET_ACCESS_KEY"],
        "aws_session_token": SECRETS["AWS_SESSION_TOKEN"],
    }
    assert got["dumpable"] == 0


def test_an_api_caller_keeps_its_environment() -> None:
    """A program that calls gatekeeper's API (the worker launch seals too) keeps
    os.environ as it was; only the environment block is overwritten."""
    got = _sealed(
        {},
        """
        os.environ["GATEKEEPER_SIGNING_KEY"] = "set-later-by-the-program"
        secrecy.seal()
        key = "GATEKEEPER_SIGNING_KEY"
        print(json.dumps({"key": os.environ.get(key), "via": secrecy.secret(key)}))
        """,
    )
    assert got == {"key": "set-later-by-the-program", "via": "set-later-by-the-program"}


def test_a_secret_the_program_deleted_is_still_overwritten() -> None:
    """The block keeps what the process started with, whatever os.environ holds later:
    a key the program read and deleted (and its copy under another name) is overwritten
    when the program first starts a worker."""
    key = SECRETS["GATEKEEPER_SIGNING_KEY"]
    code = textwrap.dedent("""
        import os
        from gatekeeper import secrecy
        del os.environ["GATEKEEPER_SIGNING_KEY"]
        secrecy.seal()
        print(open("/proc/self/environ", "rb").read().decode(errors="replace"))
    """)
    env = {**os.environ, "GATEKEEPER_SIGNING_KEY": key, "SERVICE_SETTING": f"x{key}x"}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "GATEKEEPER_SIGNING_KEY=***" in proc.stdout and "SERVICE_SETTING=***" in proc.stdout
    assert key not in proc.stdout


def test_a_confined_process_cannot_read_its_ancestors(tmp_path: Path) -> None:
    """confine.py, as a worker starts: what it execs has no_new_privs and, as root, none of
    the capabilities that read another process's memory, and the scan of this test (its
    dumpable, same-user ancestor) finds nothing it holds."""
    needle = {"mine": f"pytest-needle-{time.time_ns()}"}
    os.environ["SNOOP_TEST_HELD"] = needle["mine"]  # this process's heap, and putenv's copy
    try:
        code = (
            "import json, sys; sys.path.insert(0, sys.argv[1]); import snoop; "
            "print(json.dumps([snoop.own_status(), snoop.scan(int(sys.argv[2]), "
            "{'mine': sys.argv[3].encode()})]))"
        )
        tests = str(Path(snoop.__file__).parent)
        argv = [sys.executable, "-c", code, tests, str(os.getpid()), needle["mine"]]
        proc = subprocess.run(
            [sys.executable, "-I", "-S", str(CONFINE), "--", *argv],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        del os.environ["SNOOP_TEST_HELD"]
    assert proc.returncode == 0, proc.stderr
    status, seen = json.loads(proc.stdout)
    if os.geteuid() != 0 and not status["uid_map"]:
        pytest.skip("this kernel gives no user namespace to an unprivileged process")
    assert_confined(status)
    assert seen["found"] == {}, seen
    assert "mem" not in seen["readable"] and "environ" not in seen["readable"], seen
