"""What a malicious model's factory does to find the secrets of the job it runs in: it
walks every ancestor (the ``PPid`` chain of ``/proc/<pid>/status``) and reads what it can
of each: ``environ`` (the process's and every thread's), ``cmdline``, the files it holds
open, and its memory through ``/proc/<pid>/mem`` (every writable region ``maps`` lists:
the heap, the stack, anonymous mappings, libraries' data). Then its own environment, and
every file under the job's temp dir and the folder it was given; and it tries to plant
a ``.pth`` file in the folders ``plant.json`` names (the parent's code).

Standard library only: tests copy this file next to a project's model (``snoop.py``),
and its ``make`` factory calls :func:`report`; a test also calls :func:`scan` on a
process of its own (the positive control that the scan finds what is there to find).
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

MAX_REGION = 512 << 20  # memory regions larger than this are skipped (address space)
CHUNK = 16 << 20


def ancestors(pid: int | None = None) -> list[int]:
    """The pids above ``pid`` (default: this process), nearest first, up to init."""
    chain, pid = [], pid or os.getpid()
    while True:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            break
        found = re.search(r"^PPid:\s+(\d+)", status, re.MULTILINE)
        ppid = int(found.group(1)) if found else 0
        if ppid <= 0:
            break
        chain.append(ppid)
        pid = ppid
    return chain


def _hits(data: bytes, needles: dict[str, bytes]) -> list[str]:
    return [name for name, needle in needles.items() if needle in data]


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(64 << 20)
    except OSError:
        return None


def _memory(pid: int, needles: dict[str, bytes]) -> tuple[bool, list[str]]:
    """(whether any of its memory could be read, the needles found in it)."""
    maps = _read(f"/proc/{pid}/maps")
    try:
        mem = open(f"/proc/{pid}/mem", "rb", buffering=0)
    except OSError:
        return False, []
    found: set[str] = set()
    readable = False
    keep = max((len(n) for n in needles.values()), default=1)
    with mem:
        for line in (maps or b"").decode(errors="replace").splitlines():
            parts = line.split()
            if len(parts) < 2 or not parts[1].startswith("rw"):  # where a secret can be
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            if end - start > MAX_REGION or (len(parts) > 5 and parts[5] == "[vvar]"):
                continue
            tail = b""
            for at in range(start, end, CHUNK):
                try:
                    mem.seek(at)
                    chunk = mem.read(min(CHUNK, end - at))
                except (OSError, OverflowError, ValueError):
                    break
                readable = True
                found.update(_hits(tail + chunk, needles))
                tail = chunk[-keep:]
    return readable, sorted(found)


def scan(pid: int, needles: dict[str, bytes]) -> dict:
    """What could be read of process ``pid``, and which needles were in it."""
    seen: dict = {"pid": pid, "readable": [], "found": {}}
    seen["comm"] = (_read(f"/proc/{pid}/comm") or b"?").decode(errors="replace").strip()
    files = ["environ", "cmdline"]
    try:
        files += [f"task/{tid}/environ" for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        pass
    try:  # the regular files it holds open (a pipe or a terminal would block)
        fds = os.listdir(f"/proc/{pid}/fd")
        files += [f"fd/{fd}" for fd in fds if _regular(f"/proc/{pid}/fd/{fd}")]
    except OSError:
        pass
    for name in files:
        data = _read(f"/proc/{pid}/{name}")
        if data is None:
            continue
        seen["readable"].append(name)
        if hits := _hits(data, needles):
            seen["found"][name] = hits
    readable, hits = _memory(pid, needles)
    if readable:
        seen["readable"].append("mem")
    if hits:
        seen["found"]["mem"] = hits
    return seen


def _files(root: Path, needles: dict[str, bytes]) -> dict[str, list[str]]:
    found = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            data = _read(path) if _regular(path) and not os.path.islink(path) else None
            if data and (hits := _hits(data, needles)):
                found[path] = hits
    return found


def report(folder: Path) -> dict:
    """Scan every ancestor, this process's environment and the job's files for the
    needles in ``folder/needles.json``; the findings go to ``folder/snooped.json``."""
    needles = {k: v.encode() for k, v in json.loads((folder / "needles.json").read_text()).items()}
    doc: dict = {"ancestors": [scan(pid, needles) for pid in ancestors()]}
    own = "\0".join(f"{k}={v}" for k, v in os.environ.items()).encode()
    doc["own_environ"] = _hits(own + (_read("/proc/self/environ") or b""), needles)
    roots = [Path(os.environ[v]) for v in ("RUNNER_TEMP", "GITHUB_WORKSPACE") if v in os.environ]
    doc["files"] = {}
    for root in [*roots, folder]:
        doc["files"].update(_files(root, needles))
    doc["files"].pop(str(folder / "needles.json"), None)
    doc["status"] = own_status()
    doc["visible"] = {
        p.name: _read(f"/proc/{p.name}/cmdline")
        for p in Path("/proc").iterdir()
        if p.name.isdigit()
    }
    doc["visible"] = {
        k: (v or b"").replace(b"\0", b" ").decode(errors="replace")
        for k, v in doc["visible"].items()
    }
    plant_in = folder / "plant.json"
    if plant_in.is_file():
        doc["planted"] = plant(json.loads(plant_in.read_text()))
    report_to = folder / "report_to.txt"  # a FIFO the test reads (support/outbox.py)
    out = Path(report_to.read_text().strip()) if report_to.is_file() else folder / "snooped.json"
    with open(out, "w") as f:
        f.write(json.dumps(doc) + "\n")
    return doc


def plant(dirs: list[str]) -> dict[str, str]:
    """Try to leave a ``.pth`` file (code every later Python there runs) in each folder:
    ``written`` (and removed again) or why not."""
    done = {}
    for folder in dirs:  # $TMPDIR: the worker's own folder
        path = Path(os.path.expandvars(folder), f"zz-planted-{os.getpid()}.pth")
        try:
            path.write_text("import os  # planted by a model\n")
        except OSError as e:
            done[folder] = f"refused: {os.strerror(e.errno or 0)}"
            continue
        path.unlink()
        done[folder] = "written"
    return done


def own_status() -> dict[str, str]:
    """What this process may do: its uid, no_new_privs, capability sets, uid map."""
    lines = Path("/proc/self/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    wanted = ("Uid", "NoNewPrivs", "CapEff", "CapPrm", "CapBnd")
    status = {k: " ".join(fields.get(k, "").split()) for k in wanted}
    status["uid_map"] = " ".join((_read("/proc/self/uid_map") or b"").decode().split())
    return status
