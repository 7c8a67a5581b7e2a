"""Run one worker action in a fresh Python process with an isolated inductor cache.

The parent side of :mod:`gatekeeper.worker`; it never imports torch itself.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import WorkerError


def cache_env(cache_dir: Path) -> dict[str, str]:
    """The environment of a compile: this cache dir only, FX graph and AOT caches on."""
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    env["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "1"
    env["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "1"
    # Triton's kernels then land inside the inductor cache dir (<cache>/triton/<device>)
    env.pop("TRITON_CACHE_DIR", None)
    # no current directory on sys.path: a gatekeeper/ folder there must not shadow us
    env["PYTHONSAFEPATH"] = "1"
    return env


def run_worker(request: dict, *, cache_dir: Path, timeout: float, verbose: bool = False,
               label: str = "") -> dict:
    """Run ``request`` in a subprocess; returns its response dict (``ok`` true or false).

    Raises WorkerError only when the process dies without answering (crash, timeout).
    """
    with tempfile.TemporaryDirectory(prefix="gk-worker-") as tmp:
        req_path, resp_path = Path(tmp, "request.json"), Path(tmp, "response.json")
        log_path = Path(tmp, "worker.log")
        req_path.write_text(json.dumps(request))
        cmd = [sys.executable, "-m", "gatekeeper.worker", str(req_path), str(resp_path)]
        with open(log_path, "wb") as log:
            try:
                proc = subprocess.run(cmd, env=cache_env(cache_dir), timeout=timeout,
                                      stdin=subprocess.DEVNULL,
                                      stdout=None if verbose else log,
                                      stderr=None if verbose else subprocess.STDOUT)
            except subprocess.TimeoutExpired:
                raise WorkerError(f"{label}: worker timed out after {timeout:.0f} s") from None
        if resp_path.is_file():
            return json.loads(resp_path.read_text())
        tail = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
        last = tail[-1] if tail else "no output"
        raise WorkerError(f"{label}: worker exited with code {proc.returncode}: {last}")
