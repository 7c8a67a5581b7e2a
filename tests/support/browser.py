"""Headless Chromium for the tests that look at a page as a reader's browser shows it:
the dashboard (tests/dashboard/) and the documentation site (tests/test_docs.py)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
# what headless Chromium needs on a CI container: no sandbox (root), no GPU, and nothing
# that reaches the network or a profile shared with another run
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
]
WINDOW = (1280, 1500)


def chromium(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run headless Chromium with a fresh profile (removed afterwards)."""
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does)")
    profile = tempfile.mkdtemp(prefix="gk-chromium-")
    try:
        return subprocess.run(
            [
                CHROMIUM,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={WINDOW[0]},{WINDOW[1]}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def console_messages(stderr: str) -> list[str]:
    """What the page wrote to its console (``console.*``, uncaught exceptions, failed
    loads), from Chromium's log when it runs with ``--enable-logging=stderr``. Chromium
    logs them all at one level, so the caller decides which matter."""
    return [line.split("] ", 1)[-1] for line in stderr.splitlines() if ":CONSOLE" in line]
