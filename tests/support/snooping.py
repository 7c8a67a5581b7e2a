"""Run tests/support/snoop.py as a model's factory, and read what it found: a project
whose factory snoops (:func:`snoop_project`), and the checks every such test makes."""

from __future__ import annotations

import json
import os
import re
import shutil
import textwrap
from collections.abc import Sequence
from pathlib import Path

from support import snoop
from support.helpers import TINY_CONFIG, TINY_MODEL, write_project
from support.outbox import Outbox

CAP_BITS = {"CAP_SYS_PTRACE": 19, "CAP_SYS_ADMIN": 21, "CAP_PERFMON": 38, "CAP_BPF": 39}

SNOOP_MODEL = TINY_MODEL.replace(
    "def make():\n",
    textwrap.dedent("""
        def make():
            import pathlib
            import snoop

            snoop.report(pathlib.Path(__file__).parent)
    """).lstrip("\n"),
)
assert "snoop.report" in SNOOP_MODEL


def snoop_project(
    root: Path, needles: dict[str, str], config: str = TINY_CONFIG, plant: Sequence[str] = ()
) -> Path:
    """A project whose model's factory snoops for ``needles`` (name -> value) and tries
    to plant code in the folders ``plant``."""
    write_project(root, SNOOP_MODEL, config)
    shutil.copy(snoop.__file__, root / "snoop.py")
    (root / "needles.json").write_text(json.dumps(needles))
    (root / "plant.json").write_text(json.dumps(list(plant)))
    # the box leaves the model nowhere to write that outlives it: the findings go to a
    # FIFO this test reads
    _outboxes[root] = Outbox()
    (root / "report_to.txt").write_text(str(_outboxes[root].path))
    return root


_outboxes: dict[Path, Outbox] = {}


def snooped(project: Path) -> dict:
    """What the snoop of ``project`` found (its last report)."""
    return _outboxes.pop(project).docs()[-1]


def assert_boxed(doc: dict) -> None:
    """The snoop saw only its box: the box's init above it, and no process outside (no
    gatekeeper parent, no test, no runner) among those it could see."""
    pids = [a["pid"] for a in doc["ancestors"]]
    assert pids == [1], doc["ancestors"]
    outside = {p: c for p, c in doc["visible"].items() if re.search(r"-m (pytest|gatekeeper )", c)}
    assert not outside, outside


def parents_code() -> list[str]:
    """Where the code of a gatekeeper parent run from this interpreter lives: its
    site-packages, gatekeeper's package, the Python installation's library."""
    import sysconfig

    import gatekeeper

    paths = sysconfig.get_paths()
    return [paths["purelib"], str(Path(gatekeeper.__file__).parent), paths["stdlib"]]


def assert_found_nothing(doc: dict) -> None:
    """No needle in any ancestor, in the worker's own environment, or in a file."""
    found = {f"{a['pid']} ({a['comm']})": a["found"] for a in doc["ancestors"] if a["found"]}
    assert not found, found
    assert doc["own_environ"] == [], doc["own_environ"]
    assert doc["files"] == {}, doc["files"]


def assert_confined(status: dict[str, str]) -> None:
    """The worker's own status: no_new_privs; as root, none of the capabilities that read
    another process's memory; else a user namespace of its own, where the kernel has one."""
    assert status["NoNewPrivs"] == "1", status
    if os.geteuid() == 0:
        for field in ("CapEff", "CapPrm", "CapBnd"):
            held = int(status[field], 16)
            assert not any(held >> bit & 1 for bit in CAP_BITS.values()), (field, status)
    elif Path("/proc/self/ns/user").exists():
        uid = os.getuid()
        assert status["uid_map"] in ("", f"{uid} {uid} 1"), status
