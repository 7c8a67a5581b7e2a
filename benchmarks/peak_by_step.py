"""Where a command's worker holds its memory: the resident set of every gatekeeper worker
the command starts, sampled with the step the worker is in (its breadcrumb,
gatekeeper.boundary.breadcrumbs), and the largest per step, as a multiple of a weight
size when given.

    python benchmarks/peak_by_step.py [--every 0.2] [--weights BYTES] -- gatekeeper check ...

Reads ``/proc/<pid>/status`` (``VmRSS``) of each process whose command line runs
``gatekeeper.worker``, and ``<response>.step`` beside the response path the worker was
given (its last argument). Every worker starts fresh (``GATEKEEPER_FORKS=off``): a worker
forked from a worker server carries the server's command line, not its response path,
and reads the same peak as a fresh one (docs/configuration.md, "Forked workers").
Nothing in the worker changes; a sample every ``--every``
seconds can miss a peak shorter than that (the worker's own ``VmHWM``, its whole run's
peak, is printed beside it at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _status(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return out


def _workers(root: int) -> dict[int, Path]:
    """The gatekeeper workers among ``root``'s descendants (not other users' of the
    machine), each with its breadcrumb's path."""
    parent: dict[int, int] = {}
    argvs: dict[int, list[str]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        parent[int(proc.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        argvs[int(proc.name)] = [a.decode(errors="replace") for a in argv if a]

    def under(pid: int) -> bool:
        while pid > 1:
            if pid == root:
                return True
            pid = parent.get(pid, 0)
        return False

    return {
        pid: Path(args[-1] + ".step")
        for pid, args in argvs.items()
        if args[1:3] == ["-m", "gatekeeper.worker"] and len(args) >= 4 and under(pid)
    }


def _step(path: Path) -> str:
    try:
        return str(json.loads(path.read_text()).get("step"))
    except (OSError, ValueError, AttributeError):
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=float, default=0.2, help="seconds between samples")
    ap.add_argument("--weights", type=int, help="bytes: print each peak as a multiple too")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    proc = subprocess.Popen(cmd, env={**os.environ, "GATEKEEPER_FORKS": "off"})
    peaks: dict[tuple[int, str], int] = {}
    hwm: dict[int, int] = {}
    order: list[tuple[int, str]] = []
    while proc.poll() is None:
        for pid, crumb in _workers(proc.pid).items():
            st = _status(pid)
            if not st:
                continue
            key = (pid, _step(crumb))
            if key not in peaks:
                order.append(key)
            peaks[key] = max(peaks.get(key, 0), st.get("VmRSS", 0))
            hwm[pid] = max(hwm.get(pid, 0), st.get("VmHWM", 0))
        time.sleep(a.every)

    def show(n: int) -> str:
        x = f" ({n / a.weights:.2f}x)" if a.weights else ""
        return f"{n / 2**30:.2f} GiB{x}"

    print(f"exit {proc.returncode}", file=sys.stderr)
    for pid, step in order:
        print(f"worker {pid}  {step:<28} {show(peaks[(pid, step)])}")
    for pid, n in hwm.items():
        print(f"worker {pid}  VmHWM (its whole run)     {show(n)}")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
